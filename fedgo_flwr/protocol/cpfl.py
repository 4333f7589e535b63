"""CPFL's message (Dhasade et al., EuroMLSys 2025, Sec. 4.1): a cohort member's ``train``
reply is its local algorithm's, plus the received model's loss on its validation split
(``val_loss``, ``val_examples``) where it has one. The client's parameters
(:class:`CohortClientConfig`) name the local algorithm (:func:`local_declaration`) and its own
parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.protocol import TRAIN, Declaration, declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar
from fedgo_flwr.runtime.plugins import client_algorithms

NAME = "cpfl"
VAL_METRICS = {"val_loss": Scalar(lo=0.0), "val_examples": Scalar(lo=1.0, whole=True)}


@dataclass
class CohortClientConfig:
    """What a CPFL client reads of ``strategy.<key>``."""

    local_algorithm: str = "fedavg"
    """The client algorithm every cohort runs (``fedavg``, ``fedprox``; not ``scaffold``, whose
    server state cohorts do not keep)."""
    local_params: dict[str, Any] = field(default_factory=dict)
    """Its parameters, e.g. ``{mu: 0.01}``."""
    val_fraction: float = 0.1
    """Each client with at least ``min_val_samples`` samples keeps this share apart and reports the
    received model's loss on it."""
    min_val_samples: int = 10
    """Smallest client that keeps a validation split."""

    def check(self, c: Checker) -> None:
        c.require("val_fraction", 0 <= self.val_fraction < 1, "must be in [0, 1)")
        c.require("min_val_samples", self.min_val_samples >= 1, "must be >= 1")


def local_declaration(name: str) -> Declaration:
    """The declaration of the client algorithm a cohort runs (``ValueError`` naming why one
    cannot: an unknown name, or one whose server keeps state beyond the averaged model)."""
    known = client_algorithms()
    if name == NAME or name not in known:
        usable = [a for a in known if a != NAME]
        raise ValueError(f"unknown local algorithm {name!r}; choose one of {', '.join(usable)}")
    local = declaration(name)
    if local.server_state:
        usable = [a for a in known if a != NAME and not declaration(a).server_state]
        raise ValueError(
            f"'{name}' needs server-side state beyond the averaged model, which CPFL's cohort "
            f"servers do not keep; use an averaging algorithm ({', '.join(usable)})"
        )
    return local


def member_reply(local_algorithm: str) -> ReplySpec:
    """A cohort member's ``train`` reply: its local algorithm's with the validation report."""
    return declaration(local_algorithm).reply(TRAIN).with_metrics(**VAL_METRICS)


PROTOCOL = Declaration(
    NAME,
    {TRAIN: member_reply("fedavg")},
    Config=CohortClientConfig,
    server_state=True,  # cohorts, not one model: only the cpfl strategy drives it
)
