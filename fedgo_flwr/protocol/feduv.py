"""FedUV's messages (Son et al., CVPR 2024): FedAvg's, plus the means of its two terms; the
client's parameters (:class:`FedUVConfig`) come with every message."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedgo_flwr.experiment.schema import Checker
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

BANDWIDTHS = ("median", "fixed")


@dataclass
class FedUVConfig:
    """``variance_weight`` (alpha, the code's ``std_coeff``), ``uniformity_weight`` (lambda,
    ``unif_coeff``), ``gamma`` (null: 1/sqrt(C)), ``bandwidth`` (``median``: the code's;
    ``fixed``: ``exp(-t d^2)`` on L2-normalised features), ``t`` and ``detach_bandwidth``."""

    variance_weight: float = 2.5
    uniformity_weight: float = 0.5
    gamma: float | None = None
    bandwidth: str = "median"
    t: float = 2.0
    detach_bandwidth: bool = False

    def check(self, c: Checker) -> None:
        for key in ("variance_weight", "uniformity_weight"):
            value = getattr(self, key)
            c.require(key, math.isfinite(value) and value >= 0, "must be a finite number >= 0")
        if self.gamma is not None:
            c.require("gamma", math.isfinite(self.gamma) and self.gamma > 0, "must be > 0")
        c.choice("bandwidth", BANDWIDTHS)
        c.require("t", math.isfinite(self.t) and self.t > 0, "must be > 0")


PROTOCOL = Declaration(
    "feduv",
    {TRAIN: ReplySpec().with_metrics(uv_var=Scalar(), uv_unif=Scalar())},
    Config=FedUVConfig,
)
