"""The names a configuration accepts: datasets, models, partition schemes, experiment names.

Part of the configuration layer (standard library only): :mod:`fedgo_flwr.config.experiment`
checks a config against these lists without importing the library that implements them. The
library imports them from here (:func:`fedgo_flwr.data.sources.load_dataset`,
:func:`fedgo_flwr.models.classifiers.build_model`, :mod:`fedgo_flwr.data.partition`), so a name
is listed once.

:data:`DATASETS` is the one registry of built-in datasets: each entry holds what every part of
the project knows of a dataset (its loader, by dotted path, so that this layer imports no
library; its input shape and classes; the folder that must exist before a run; whether it can
be downloaded). The config check, the loader, the pre-flight check, FedGO's generator check and
the documentation all read it, so adding a dataset is one entry.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = [
    "DATASETS",
    "TORCHVISION_ROOT",
    "Dataset",
    "HF_PREFIX",
    "MAX_NAME_BYTES",
    "MODEL_NAMES",
    "NAME_PATTERN",
    "PARTITION_SCHEMES",
    "PRECISIONS",
    "dataset_entry",
    "dataset_names",
    "hf_id",
    "is_dataset_name",
    "path_problem",
    "unprintable",
]

TORCHVISION_ROOT = "~/.cache/fedgo_flwr/torchvision"
"""Where torchvision's datasets are kept when ``data.path`` is not set."""


@dataclass(frozen=True)
class Dataset:
    """What the project knows of one built-in dataset (an entry of :data:`DATASETS`)."""

    loader: str
    """``"module:function"`` that loads it: :func:`fedgo_flwr.data.sources.load_dataset` calls
    it with the keywords ``name``, ``path`` (``data.path``, else :attr:`default_path`),
    ``download`` and ``cache_dir``; it returns a ``DataBundle``."""
    about: str
    """What it is, for the documentation of ``data.dataset`` (docstring markup)."""
    input_shape: tuple[int, ...] | None = None
    """One sample's shape (``(C, H, W)`` for images), so that a check need not load the data;
    ``None``: read from the data (it depends on the files)."""
    num_classes: int | None = None
    """The number of classes; ``None``: read from the data."""
    folder: str | None = None
    """The folder that must exist under the data's root (``data.path``) before a run (the
    pre-flight check), unless :attr:`download` and ``data.download`` let the loader fetch it."""
    download: bool = False
    """Whether ``data.download: true`` lets the loader download it."""
    default_path: str | None = None
    """The data's root when ``data.path`` is not set; ``None`` with :attr:`folder`: ``data.path``
    is required."""


DATASETS: dict[str, Dataset] = {
    "digits": Dataset(
        "fedgo_flwr.data.sources:load_digits",
        "scikit-learn's 8x8 digits, built in",
        input_shape=(1, 8, 8),
        num_classes=10,
    ),
    "four_gaussians": Dataset(
        "fedgo_flwr.data.sources:load_four_gaussians",
        "synthetic, FedGO App. E.1",
        input_shape=(2,),
        num_classes=3,
    ),
    "cifar10": Dataset(
        "fedgo_flwr.data.sources:load_cifar",
        "torchvision",
        input_shape=(3, 32, 32),
        num_classes=10,
        folder="cifar-10-batches-py",
        download=True,
        default_path=TORCHVISION_ROOT,
    ),
    "cifar100": Dataset(
        "fedgo_flwr.data.sources:load_cifar",
        "torchvision",
        input_shape=(3, 32, 32),
        num_classes=100,
        folder="cifar-100-python",
        download=True,
        default_path=TORCHVISION_ROOT,
    ),
    "imagefolder": Dataset(
        "fedgo_flwr.data.sources:load_image_tree",
        "a local ``train/<class>/*``, ``test/<class>/*`` tree",
        folder="train",
    ),
}
"""The built-in datasets by name (``data.dataset``); one entry per dataset."""
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


def dataset_names() -> tuple[str, ...]:
    """The built-in dataset names, in :data:`DATASETS`' order."""
    return tuple(DATASETS)


def dataset_entry(name: str) -> Dataset | None:
    """The entry of built-in dataset ``name`` (``None`` for ``"hf:"`` and unknown names)."""
    return DATASETS.get(name)


def is_dataset_name(name: str) -> bool:
    """True for a built-in name (:data:`DATASETS`) or ``"hf:"`` followed by a hub id."""
    return name in DATASETS or hf_id(name) is not None


def hf_id(name: str) -> str | None:
    """The hub id of an ``"hf:<id>"`` name (``None`` for other names or an empty id)."""
    if not name.startswith(HF_PREFIX):
        return None
    return name[len(HF_PREFIX) :].strip() or None
