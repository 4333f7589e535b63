"""FedUV's messages (Son et al., CVPR 2024): FedAvg's, plus the means of its two terms."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

PROTOCOL = Declaration(
    "feduv", {TRAIN: ReplySpec().with_metrics(uv_var=Scalar(), uv_unif=Scalar())}
)
