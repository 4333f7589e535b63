"""Tests for fedgo_flwr.data (array datasets, batching, loaders).  Nothing is downloaded."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fedgo_flwr.config.names import HF_PREFIX, dataset_names, is_dataset_name
from fedgo_flwr.data import (
    FOUR_GAUSSIANS_MEANS,
    FOUR_GAUSSIANS_PAPER_OWNERS,
    ArrayDataset,
    batches,
    four_gaussians_server_data,
    indexed_batches,
    load_dataset,
    load_hf_dataset,
    make_four_gaussians,
    stratified_subset,
)
from fedgo_flwr.data import imagefolder as imagefolder_module
from fedgo_flwr.data.partition import component_partition

# ------------------------------------------------------------------------------------------
# digits
# ------------------------------------------------------------------------------------------


def test_digits_shapes_dtypes_and_range() -> None:
    b = load_dataset("digits")
    assert b.name == "digits"
    assert len(b.train) + len(b.test) == 1797
    assert len(b.test) == 360
    for ds in (b.train, b.test):
        assert ds.x.dtype == np.uint8 and ds.x.shape[1:] == (1, 8, 8)
        assert ds.input_shape == (1, 8, 8)
        assert ds.y.dtype == np.int64 and ds.num_classes == 10
        assert ds.flip is False
    assert b.train.x.min() == 0 and b.train.x.max() == 255
    x, y = b.train.to_tensors()
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.shape == (len(b.train), 1, 8, 8)
    assert float(x.min()) == -1.0 and float(x.max()) == 1.0
    # stratified: every class appears in test with roughly 20% of its samples
    counts_test = np.bincount(b.test.y, minlength=10)
    counts_all = counts_test + np.bincount(b.train.y, minlength=10)
    assert np.all(np.abs(counts_test / counts_all - 0.2) < 0.02)


def test_digits_split_is_fixed() -> None:
    a = load_dataset("digits")
    b = load_dataset("digits")
    assert np.array_equal(a.test.x, b.test.x) and np.array_equal(a.test.y, b.test.y)
    assert np.array_equal(a.train.x, b.train.x) and np.array_equal(a.train.y, b.train.y)


def test_digits_come_from_a_cache_equal_to_scikit_learns_split(tmp_path, monkeypatch) -> None:
    """The first load computes the split with scikit-learn and keeps it; later loads read it
    (bit for bit the same arrays); a damaged file is computed again and replaced."""
    from fedgo_flwr.data import sources

    monkeypatch.setattr(sources, "DIGITS_CACHE", tmp_path / "digits")
    first = load_dataset("digits")
    (kept,) = (tmp_path / "digits").iterdir()
    reference = sources._digits_from_sklearn()
    for bundle in (first, load_dataset("digits")):
        assert np.array_equal(bundle.train.x, reference["x"][reference["idx_train"]])
        assert np.array_equal(bundle.test.y, reference["y"][reference["idx_test"]])
        assert bundle.class_names == tuple("0123456789")
    kept.write_bytes(b"not an npz")
    again = load_dataset("digits")
    assert np.array_equal(again.train.x, first.train.x) and kept.read_bytes()[:2] == b"PK"
    monkeypatch.setattr(sources, "_digits_from_sklearn", lambda: pytest.fail("recomputed"))
    assert np.array_equal(load_dataset("digits").test.x, first.test.x)  # read, not computed


def test_digits_from_the_cache_do_not_import_scikit_learn(tmp_path, monkeypatch) -> None:
    """Importing scikit-learn costs every process that loads the digits seconds; with the
    cache filled, a fresh process loads them without it."""
    import subprocess

    from fedgo_flwr.data import sources

    monkeypatch.setattr(sources, "DIGITS_CACHE", tmp_path)
    load_dataset("digits")  # fills the cache
    code = (
        "import sys; from pathlib import Path; from fedgo_flwr.data import sources; "
        f"sources.DIGITS_CACHE = Path({str(tmp_path)!r}); "
        "b = sources.load_dataset('digits'); print(len(b.train), 'sklearn' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["1437", "False"]


def test_subset_and_to_tensors_index() -> None:
    b = load_dataset("digits")
    idx = np.array([5, 0, 17])
    sub = b.train.subset(idx)
    assert len(sub) == 3 and sub.num_classes == 10 and sub.flip == b.train.flip
    assert np.array_equal(sub.y, b.train.y[idx])
    x, y = b.train.to_tensors(idx)
    assert torch.equal(x, sub.to_tensors()[0]) and y.tolist() == b.train.y[idx].tolist()


# ------------------------------------------------------------------------------------------
# four_gaussians (FedGO App. E.1)
# ------------------------------------------------------------------------------------------


def test_four_gaussians_matches_paper() -> None:
    b = load_dataset("four_gaussians")
    for ds in (b.train, b.test):
        assert ds.x.shape == (1200, 2) and ds.x.dtype == np.float32
        assert ds.num_classes == 3 and ds.flip is False
        # (4,4) and (-4,-4) are red (class 0): 600; blue (-4,4): 300; green (4,-4): 300
        assert np.bincount(ds.y).tolist() == [600, 300, 300]
    x, y, comp = make_four_gaussians("train")
    assert np.array_equal(x, b.train.x) and np.array_equal(y, b.train.y)
    for j, mean in enumerate(FOUR_GAUSSIANS_MEANS):
        pts = x[comp == j]
        assert pts.shape == (300, 2)
        assert np.allclose(pts.mean(axis=0), mean, atol=0.4)
        assert np.allclose(pts.var(axis=0), 3.0, rtol=0.25)  # variance 3
    # identical across calls; train and test differ
    again = load_dataset("four_gaussians")
    assert np.array_equal(again.train.x, b.train.x) and np.array_equal(again.test.x, b.test.x)
    assert not np.array_equal(b.train.x, b.test.x)
    # the paper's client split: 90% of the owned Gaussian, 10% from the others
    p = component_partition(comp, 0.9, owners=FOUR_GAUSSIANS_PAPER_OWNERS)
    assert p.client_sizes == [300, 300, 300, 300]
    # server: 300 unlabeled points uniform on [-12, 12]^2
    srv = four_gaussians_server_data()
    assert srv.x.shape == (300, 2) and np.abs(srv.x).max() <= 12.0
    x_t, _ = b.train.to_tensors()
    assert torch.equal(x_t, torch.from_numpy(b.train.x))  # features are not rescaled


def test_stratified_subset_keeps_class_shares_and_ignores_the_seed():
    labels = np.repeat(np.arange(4), [100, 200, 300, 400])
    idx = stratified_subset(labels, 250)
    assert len(idx) == 250 and len(np.unique(idx)) == 250
    np.testing.assert_array_equal(np.bincount(labels[idx]), [25, 50, 75, 100])
    np.testing.assert_array_equal(idx, stratified_subset(labels, 250))


# ------------------------------------------------------------------------------------------
# batches
# ------------------------------------------------------------------------------------------


def _id_dataset(n: int) -> ArrayDataset:
    return ArrayDataset(np.arange(n, dtype=np.float32)[:, None], np.arange(n) % 3, num_classes=3)


def _image_dataset(n: int, flip: bool = True) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n, 3, 4, 5), dtype=np.uint8)
    x[:, :, :, 0] = 0  # make every image visibly asymmetric
    x[:, :, :, -1] = 255
    return ArrayDataset(x, rng.integers(0, 4, n), num_classes=4, flip=flip)


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_cover_every_sample_once(shuffle: bool) -> None:
    ds = _id_dataset(103)
    g = torch.Generator().manual_seed(0)
    got = list(batches(ds, 10, shuffle=shuffle, rng=g))
    assert [len(yb) for _, yb in got] == [10] * 10 + [3]
    ids = torch.cat([xb[:, 0] for xb, _ in got]).long()
    assert sorted(ids.tolist()) == list(range(103))
    assert (ids.tolist() != list(range(103))) == shuffle
    for xb, yb in got:
        assert xb.dtype == torch.float32 and yb.dtype == torch.int64
        assert torch.equal(yb, xb[:, 0].long() % 3)
    dropped = list(batches(ds, 10, shuffle=True, rng=g, drop_last=True))
    assert [len(yb) for _, yb in dropped] == [10] * 10


def test_batches_reproducible_with_same_generator_seed() -> None:
    ds = _image_dataset(64)

    def run(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(2):  # two epochs from one generator
            out += list(batches(ds, 16, shuffle=True, rng=g, augment=True))
        return out

    a, b, c = run(7), run(7), run(8)
    assert all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )
    assert not all(torch.equal(xa, xc) for (xa, _), (xc, _) in zip(a, c, strict=True))


def test_flips_happen_only_when_allowed() -> None:
    ds = _image_dataset(200)
    ref, _ = ds.to_tensors()
    assert float(ref.min()) == -1.0 and float(ref.max()) == 1.0
    g = torch.Generator().manual_seed(1)
    flipped = pos = 0
    for xb, _ in batches(ds, 50, shuffle=False, rng=g, augment=True):
        orig = ref[pos : pos + len(xb)]
        same = (xb == orig).flatten(1).all(1)
        mirrored = (xb == orig.flip(-1)).flatten(1).all(1)
        assert bool((same ^ mirrored).all()), "each image is either unchanged or mirrored"
        flipped += int(mirrored.sum())
        pos += len(xb)
    assert 60 <= flipped <= 140  # ~ Binomial(200, 0.5)

    # augment=False, or a dataset that must not be flipped: never mirrored
    no_flip = _image_dataset(200, flip=False)
    for d, aug in ((ds, False), (no_flip, True)):
        out = torch.cat([xb for xb, _ in batches(d, 64, shuffle=False, augment=aug)])
        assert torch.equal(out, ref)


def test_indexed_batches_name_the_samples_and_flips_of_the_batches() -> None:
    """The same batches as ``batches`` from the same seed, each with the dataset indices and
    the flip mask that produce it from the stored images."""
    ds = _image_dataset(70)
    ref, labels = ds.to_tensors()
    plain = list(batches(ds, 16, shuffle=True, rng=torch.Generator().manual_seed(3), augment=True))
    indexed = list(
        indexed_batches(ds, 16, shuffle=True, rng=torch.Generator().manual_seed(3), augment=True)
    )
    assert len(plain) == len(indexed) == 5
    for (x, y), b in zip(plain, indexed, strict=True):
        assert torch.equal(x, b.x) and torch.equal(y, b.y)
        rebuilt = torch.where(b.flipped[:, None, None, None], ref[b.index].flip(-1), ref[b.index])
        assert torch.equal(b.x, rebuilt) and torch.equal(b.y, labels[b.index])
    assert 0 < int(torch.cat([b.flipped for b in indexed]).sum()) < 70
    still = next(iter(indexed_batches(ds, 8, shuffle=False)))
    assert still.index.tolist() == list(range(8)) and not bool(still.flipped.any())
    with pytest.raises(ValueError, match="batch_size"):
        indexed_batches(ds, 0, shuffle=False)


def test_batches_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        batches(_id_dataset(4), 0, shuffle=False)


def test_array_dataset_validation() -> None:
    with pytest.raises(ValueError, match="y must have shape"):
        ArrayDataset(np.zeros((3, 2), np.float32), np.zeros(4), num_classes=2)
    with pytest.raises(ValueError, match="labels must lie"):
        ArrayDataset(np.zeros((3, 2), np.float32), np.array([0, 1, 2]), num_classes=2)
    ds = ArrayDataset(np.zeros((3, 2), np.float64), np.array([0, 1, 1]), num_classes=2)
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64


# ------------------------------------------------------------------------------------------
# imagefolder
# ------------------------------------------------------------------------------------------

W, H = 6, 5


def _write_image(path: Path, value: int, size: tuple[int, int] = (W, H)) -> None:
    from PIL import Image

    arr = np.full((size[1], size[0], 3), value, dtype=np.uint8)
    arr[:, 0, 0] = 255 - value  # a marker column so images are not uniform
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(arr)
    if path.suffix == ".png":
        img.save(path)
    else:
        img.save(path, quality=95)


def _make_tree(root: Path, classes: dict[str, tuple[str, ...]] | None = None) -> Path:
    classes = classes or {"train": ("cat", "dog"), "test": ("cat", "dog")}
    for split, names in classes.items():
        for c, name in enumerate(names):
            for i in range(3):
                _write_image(root / split / name / f"{i:02d}.png", 10 * c + i)
            _write_image(root / split / name / "03.jpg", 100 + c)
    return root


def test_imagefolder_loads_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _make_tree(tmp_path / "tree")
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    cache = tmp_path / "cache"
    b = load_dataset("imagefolder", path=str(root), cache_dir=str(cache))
    assert b.class_names == ("cat", "dog")
    assert b.train.x.shape == (8, 3, H, W) and b.train.x.dtype == np.uint8
    assert b.test.x.shape == (8, 3, H, W)
    assert b.train.y.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert b.train.num_classes == 2 and b.train.flip is True
    # sorted file order: cat/00.png is first; PNG is lossless
    assert (b.train.x[0, 0, :, 0] == 255).all() and (b.train.x[0, 0, :, 1:] == 0).all()
    assert (b.train.x[0, 1:] == 0).all()
    assert int(b.train.x[5, 2, 2, 3]) == 11  # dog/01.png
    assert any(cache.glob("imagefolder-*/meta.json"))

    def boom(file: Path) -> np.ndarray:
        raise AssertionError(f"decoder called for {file} although the cache is valid")

    monkeypatch.setattr(imagefolder_module, "_decode_image", boom)
    again = load_dataset("imagefolder", path=str(root), cache_dir=str(cache))
    assert np.array_equal(again.train.x, b.train.x) and np.array_equal(again.test.y, b.test.y)
    assert again.class_names == b.class_names

    # a changed tree invalidates the cache (the decoder is needed again)
    _write_image(root / "train" / "dog" / "04.png", 7)
    with pytest.raises(AssertionError, match="decoder called"):
        load_dataset("imagefolder", path=str(root), cache_dir=str(cache))


def test_imagefolder_default_cache_location(tmp_path: Path) -> None:
    root = _make_tree(tmp_path / "tree")
    b = load_dataset("imagefolder", path=str(root))
    assert len(b.train) == 8
    assert list((root / ".fedgo_cache").glob("imagefolder-*/train_x.npy"))
    assert not list((root / ".fedgo_cache").rglob("*.tmp"))
    # the cache may be shared: its files are world-readable whatever the umask
    files = [f for f in (root / ".fedgo_cache").rglob("*") if f.is_file()]
    assert len(files) == 5 and all(f.stat().st_mode & 0o777 == 0o644 for f in files)


def test_imagefolder_falls_back_to_home_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _make_tree(tmp_path / "tree")
    home_cache = tmp_path / "home-cache"
    monkeypatch.setattr(imagefolder_module, "DEFAULT_CACHE_ROOT", str(home_cache))
    real = imagefolder_module._is_writable_dir
    monkeypatch.setattr(
        imagefolder_module, "_is_writable_dir", lambda d: d.name != ".fedgo_cache" and real(d)
    )  # pretend the data tree is read-only
    first = load_dataset("imagefolder", path=str(root))
    assert list(home_cache.glob("imagefolder-*/meta.json"))

    def boom(file: Path) -> np.ndarray:
        raise AssertionError("decoder called although the cache is valid")

    monkeypatch.setattr(imagefolder_module, "_decode_image", boom)
    again = load_dataset("imagefolder", path=str(root))
    assert np.array_equal(again.train.x, first.train.x)


def test_imagefolder_parallel_decode_is_deterministic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = _make_tree(tmp_path / "tree")
    serial = load_dataset("imagefolder", path=str(root), cache_dir=str(tmp_path / "c1"))
    monkeypatch.setattr(imagefolder_module, "_PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(imagefolder_module, "_CHUNK", 3)
    monkeypatch.setattr(imagefolder_module, "_DECODE_WORKERS", 2)
    with caplog.at_level("WARNING", logger="fedgo_flwr.data"):
        parallel = load_dataset("imagefolder", path=str(root), cache_dir=str(tmp_path / "c2"))
    assert "decoding serially" not in caplog.text  # the process pool really ran
    assert np.array_equal(np.asarray(serial.train.x), np.asarray(parallel.train.x))
    assert np.array_equal(np.asarray(serial.test.x), np.asarray(parallel.test.x))


def test_imagefolder_class_mismatch(tmp_path: Path) -> None:
    root = _make_tree(tmp_path / "tree", {"train": ("cat", "dog"), "test": ("cat", "horse")})
    with pytest.raises(ValueError, match=r"dog.*horse"):
        load_dataset("imagefolder", path=str(root), cache_dir=str(tmp_path / "c"))


def test_imagefolder_size_mismatch_names_file(tmp_path: Path) -> None:
    root = _make_tree(tmp_path / "tree")
    _write_image(root / "test" / "dog" / "05.png", 3, size=(7, 7))
    with pytest.raises(ValueError, match=r"05\.png"):
        load_dataset("imagefolder", path=str(root), cache_dir=str(tmp_path / "c"))


def test_imagefolder_needs_path_and_unknown_name() -> None:
    with pytest.raises(ValueError, match="path"):
        load_dataset("imagefolder")
    with pytest.raises(ValueError, match="digits.*four_gaussians.*cifar10.*imagefolder") as ei:
        load_dataset("mnist-nope")
    assert all(n in str(ei.value) for n in dataset_names())


# ------------------------------------------------------------------------------------------
# CIFAR (no download) and Hugging Face
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_missing_without_download(tmp_path: Path, name: str) -> None:
    root = tmp_path / "nothing-here"
    with pytest.raises(FileNotFoundError, match=r"data\.download: true") as ei:
        load_dataset(name, path=str(root), download=False)
    assert "data.path" in str(ei.value)
    assert not root.exists() or not any(root.iterdir())  # nothing was downloaded


def test_load_hf_dataset_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install datasets"):
        load_hf_dataset("uoft-cs/cifar10")
    with pytest.raises(ImportError, match=r"pip install \.\[hf\]"):
        load_dataset("hf:uoft-cs/cifar10")


def test_is_dataset_name() -> None:
    assert HF_PREFIX == "hf:"
    assert all(is_dataset_name(n) for n in dataset_names())
    assert is_dataset_name("hf:uoft-cs/cifar10") and is_dataset_name("hf:mnist")
    for bad in ("hf:", "hf:  ", "mnist", "CIFAR10", "", "uoft-cs/cifar10", "HF:mnist"):
        assert not is_dataset_name(bad), bad


class _FakeHFSplit:
    """A column-access stand-in for a Hugging Face ``datasets.Dataset``."""

    def __init__(self, values: list[int], labels: list[int], names: list[str]) -> None:
        from PIL import Image

        self.features = {"label": types.SimpleNamespace(names=names)}
        # grayscale 3x2 images: the loader converts them to RGB
        images = [Image.fromarray(np.full((2, 3), v, dtype=np.uint8)) for v in values]
        self._columns = {"img": images, "label": labels}

    def __getitem__(self, column: str) -> list:
        return self._columns[column]


def test_hf_name_routes_to_the_hub_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def fake_load_dataset(name: str) -> dict[str, _FakeHFSplit]:
        asked.append(name)
        names = ["cat", "dog", "frog"]
        return {
            "train": _FakeHFSplit([10, 20, 30, 40], [0, 1, 2, 1], names),
            "test": _FakeHFSplit([50, 60], [2, 0], names),
        }

    fake = types.ModuleType("datasets")
    fake.load_dataset = fake_load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)

    b = load_dataset("hf:uoft-cs/cifar10")
    assert asked == ["uoft-cs/cifar10"]  # the hub id, case and slash kept, prefix stripped
    assert b.name == "hf:uoft-cs/cifar10" and b.class_names == ("cat", "dog", "frog")
    assert b.train.x.shape == (4, 3, 2, 3) and b.train.x.dtype == np.uint8
    assert b.test.x.shape == (2, 3, 2, 3)
    assert b.train.x[:, :, 0, 0].tolist() == [[v] * 3 for v in (10, 20, 30, 40)]
    assert b.train.y.tolist() == [0, 1, 2, 1] and b.test.y.tolist() == [2, 0]
    assert b.train.num_classes == 3 and b.train.flip is True

    with pytest.raises(ValueError, match="hub dataset id"):
        load_dataset("hf:")
    assert asked == ["uoft-cs/cifar10"]


def test_cifar_conversion_with_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.datasets

    class FakeCIFAR10:
        base_folder = "cifar-10-batches-py"

        def __init__(self, root: str, train: bool, download: bool) -> None:
            n = 6 if train else 4
            self.data = np.arange(n * 32 * 32 * 3, dtype=np.int64).reshape(n, 32, 32, 3) % 256
            self.data = self.data.astype(np.uint8)
            self.targets = list(range(n))
            self.classes = [f"c{i}" for i in range(10)]

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    b = load_dataset("cifar10", path="/nonexistent")
    assert b.train.x.shape == (6, 3, 32, 32) and b.test.x.shape == (4, 3, 32, 32)
    ref = FakeCIFAR10("", True, False).data
    assert np.array_equal(b.train.x[2, 1], ref[2, :, :, 1])  # HWC -> CHW
    assert b.train.flip is True and b.train.num_classes == 10
    assert b.train.y.tolist() == list(range(6)) and b.class_names[0] == "c0"


def test_imagefolder_orders_files_by_path_components_and_keys_them_by_hand(tmp_path: Path) -> None:
    """Files sort as path components (``a/b`` before ``a-c``, which plain string order swaps:
    '-' < '/'), and the cache key is the documented hash of root, relative paths, sizes and
    mtimes, so a cache written by either listing is found by the other."""
    import hashlib
    import os

    root = tmp_path / "tree"
    for split in ("train", "test"):
        _write_image(root / split / "cat" / "a" / "b.png", 1)
        _write_image(root / split / "cat" / "a-c.png", 2)
        _write_image(root / split / "dog" / "x.png", 3)
    root = root.resolve()
    classes, files, labels = imagefolder_module._list_split(root / "train")
    assert classes == ["cat", "dog"] and labels == [0, 0, 1]
    relative = [os.path.relpath(f, root) for f in files]
    assert relative == ["train/cat/a/b.png", "train/cat/a-c.png", "train/dog/x.png"]
    assert [Path(f) for f in files] == sorted(Path(f) for f in files)
    assert sorted(relative) != relative  # string order would differ

    _, test_files, _ = imagefolder_module._list_split(root / "test")
    h = hashlib.sha256()
    h.update(f"fedgo-imagefolder-v1\0{root}\0".encode())
    for split, listed in (("train", files), ("test", test_files)):
        h.update(f"[{split}]\0".encode())
        for f in listed:
            st = os.stat(f)
            h.update(f"{os.path.relpath(f, root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    key = imagefolder_module._tree_key(root, {"train": files, "test": test_files})
    assert key == h.hexdigest()[:24]
