"""Datasets for fedgo-flwr: in-memory arrays, fast batching and loaders by name.

All datasets are held as :class:`ArrayDataset` -- ``uint8`` images ``(N, C, H, W)`` or ``float32``
feature vectors ``(N, D)`` plus ``int64`` labels -- and are batched by :func:`batches`, which
normalises images to ``[-1, 1]`` (FedGO App. E.2) and applies random horizontal flips on the batch
tensor, drawing all randomness from one ``torch.Generator``.

The package is split by what each part owns:

* :mod:`fedgo_flwr.data.arrays` -- :class:`ArrayDataset`, :class:`DataBundle`, normalisation,
  :func:`batches` (and :func:`indexed_batches`, which also says which samples a batch holds)
  and :func:`stratified_subset`;
* :mod:`fedgo_flwr.data.sources` -- :func:`load_dataset` (names: those of
  :func:`fedgo_flwr.config.names.is_dataset_name`) and the built-in sources (``digits``,
  ``four_gaussians``, torchvision CIFAR-10/100, Hugging Face ``datasets``);
* :mod:`fedgo_flwr.data.imagefolder` -- :func:`load_imagefolder` and its decode cache, and
  :func:`load_unlabeled` (any folder of images, e.g. a public distillation set).
"""

from fedgo_flwr.data.arrays import (
    ArrayDataset,
    DataBundle,
    IndexedBatch,
    batches,
    ends_in_batch_of_one,
    indexed_batches,
    stratified_subset,
)
from fedgo_flwr.data.imagefolder import IMAGE_EXTENSIONS, load_imagefolder, load_unlabeled
from fedgo_flwr.data.sources import (
    FOUR_GAUSSIANS_LABELS,
    FOUR_GAUSSIANS_MEANS,
    FOUR_GAUSSIANS_PAPER_OWNERS,
    FOUR_GAUSSIANS_PER_COMPONENT,
    FOUR_GAUSSIANS_VARIANCE,
    four_gaussians_oracle_labels,
    four_gaussians_server_data,
    load_dataset,
    load_hf_dataset,
    make_four_gaussians,
)

__all__ = [
    "FOUR_GAUSSIANS_LABELS",
    "FOUR_GAUSSIANS_MEANS",
    "FOUR_GAUSSIANS_PAPER_OWNERS",
    "FOUR_GAUSSIANS_PER_COMPONENT",
    "FOUR_GAUSSIANS_VARIANCE",
    "IMAGE_EXTENSIONS",
    "ArrayDataset",
    "DataBundle",
    "IndexedBatch",
    "batches",
    "ends_in_batch_of_one",
    "indexed_batches",
    "four_gaussians_oracle_labels",
    "four_gaussians_server_data",
    "load_dataset",
    "load_hf_dataset",
    "load_imagefolder",
    "load_unlabeled",
    "make_four_gaussians",
    "stratified_subset",
]
