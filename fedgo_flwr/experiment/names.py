"""The names a configuration accepts: datasets, models, partition schemes, experiment names.

Part of the configuration layer (standard library only): :mod:`fedgo_flwr.experiment.config`
checks a config against these lists without importing the library that implements them. The
library imports them from here (:func:`fedgo_flwr.data.sources.load_dataset`,
:func:`fedgo_flwr.models.classifiers.build_model`, :mod:`fedgo_flwr.data.partition`), so a name
is listed once.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "DATASET_NAMES",
    "HF_PREFIX",
    "MAX_NAME_BYTES",
    "MODEL_NAMES",
    "NAME_PATTERN",
    "PARTITION_SCHEMES",
    "PRECISIONS",
    "hf_id",
    "is_dataset_name",
    "path_problem",
    "unprintable",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "four_gaussians", "cifar10", "cifar100", "imagefolder")
"""The built-in dataset names."""
HF_PREFIX = "hf:"
"""``"hf:<hub dataset id>"`` names a Hugging Face dataset, e.g. ``"hf:uoft-cs/cifar10"``."""

MODEL_NAMES: tuple[str, ...] = (
    "cnn",
    "cnn_bn",
    "mlp",
    "resnet8",
    "resnet18",
    "vgg11_bn",
    "resnet50",
    "gn_lenet",
    "cnn5",
    "lenet5",
    "mobilenetv3_small",
    "shufflenetv2",
)
"""Names accepted by :func:`fedgo_flwr.models.classifiers.build_model`."""

PARTITION_SCHEMES: tuple[str, ...] = ("dirichlet", "dirichlet_prior", "classes")
"""Client-split schemes of ``data.partition`` (:mod:`fedgo_flwr.data.partition`)."""

PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
"""Values of ``resources.precision`` (:func:`fedgo_flwr.runtime.kernels.autocast`)."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*")
"""What an experiment name must look like to name a folder (no separators, no ``..``)."""
MAX_NAME_BYTES = 255
"""The longest file or folder name, in UTF-8 bytes, that common file systems take (ext4, XFS,
APFS, NTFS: 255)."""


def unprintable(text: str) -> str | None:
    """``"holds the control character '\\n'"`` (or a lone surrogate, which no file name or JSON
    file can hold) for the first such character of ``text``; ``None`` if it has none."""
    bad = next((ch for ch in text if unicodedata.category(ch) in ("Cc", "Cs")), None)
    if bad is None:
        return None
    kind = "control character" if unicodedata.category(bad) == "Cc" else "lone surrogate"
    return f"holds the {kind} {bad!r}"


def path_problem(path: str, relative: bool = False) -> str | None:
    """Why ``path`` (``/``-separated) cannot name a file or folder, or ``None`` if it can.

    Refused: a control character (NUL, newline, tab, ESC ...: a name that would also forge log
    lines), a lone surrogate (not encodable) and a component longer than
    :data:`MAX_NAME_BYTES`. With ``relative`` (a name inside a folder, e.g. an archive member),
    also an absolute or empty path and a ``.``, ``..`` or empty component: such a name leaves
    its folder or names it twice.
    """
    bad = unprintable(path)
    if bad is not None:
        return bad
    parts = path.split("/")
    if relative:
        if path.startswith("/"):
            return "is an absolute path"
        if any(part in ("", ".", "..") for part in parts):
            return "has an empty, '.' or '..' component"
    long = next((part for part in parts if len(part.encode()) > MAX_NAME_BYTES), None)
    if long is not None:
        return f"has a component of {len(long.encode())} bytes (at most {MAX_NAME_BYTES})"
    return None


def is_dataset_name(name: str) -> bool:
    """True for a built-in name (:data:`DATASET_NAMES`) or ``"hf:"`` followed by a hub id."""
    return name in DATASET_NAMES or hf_id(name) is not None


def hf_id(name: str) -> str | None:
    """The hub id of an ``"hf:<id>"`` name (``None`` for other names or an empty id)."""
    if not name.startswith(HF_PREFIX):
        return None
    return name[len(HF_PREFIX) :].strip() or None
