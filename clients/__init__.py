"""Client-side training, one module per algorithm; ``CLIENTS`` maps names to classes."""

from clients.base import ClientJob, FedAvgClient
from clients.fedprox import FedProxClient
from clients.scaffold import ScaffoldClient

CLIENTS: dict[str, type[FedAvgClient]] = {
    cls.name: cls for cls in (FedAvgClient, FedProxClient, ScaffoldClient)
}

__all__ = ["CLIENTS", "ClientJob", "FedAvgClient", "FedProxClient", "ScaffoldClient"]
