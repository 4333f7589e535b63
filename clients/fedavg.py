"""The FedAvg client: local training from the received global model.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, Alg. 1 (ClientUpdate): E epochs of minibatch SGD on the local data, then the
updated weights go back with the number of local examples. That is
:class:`clients.base.ClientAlgorithm`'s default, so FedAvg only names itself.
"""

from __future__ import annotations

from clients.base import ClientAlgorithm


class FedAvgClient(ClientAlgorithm):
    name = "fedavg"
