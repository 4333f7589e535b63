"""One entry per dataset: a throwaway entry of ``DATASETS`` is seen by every part that knows
datasets (the names, the config check, the loader, FedGO's pre-flight shape, the pre-flight
folder check and the configuration page)."""

from __future__ import annotations

from pathlib import Path

import pytest

import strategies._prefl as prefl
from docs.gen_configuration import generate
from fedgo_app.cli import preflight
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.config.names import DATASETS, Dataset, dataset_names, is_dataset_name
from fedgo_flwr.data import load_dataset
from strategies import load_experiment

TOY = Dataset(
    "fedgo_flwr.data.sources:load_four_gaussians",
    "a throwaway entry of the registry test",
    input_shape=(2,),
    num_classes=3,
    folder="toy-points-files",
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(DATASETS, "toy_points", TOY)
    return "toy_points"


def test_the_registry_names_each_built_in_dataset_once():
    assert dataset_names() == ("digits", "four_gaussians", "cifar10", "cifar100", "imagefolder")
    assert [DATASETS[n].num_classes for n in ("digits", "cifar10", "cifar100")] == [10, 10, 100]
    for name, entry in DATASETS.items():
        module, _, function = entry.loader.partition(":")
        assert module and function, name
        if entry.folder is not None:  # a folder lives under data.path or the entry's default
            assert entry.download == (entry.default_path is not None), name


def test_the_running_guide_says_where_each_dataset_comes_from():
    text = (Path(__file__).resolve().parents[2] / "docs" / "running.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for name in dataset_names():
        assert any(f"`{name}`" in row.split(" | ")[0] for row in rows), name


def test_every_user_sees_a_new_entry(toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # names
    assert toy in dataset_names() and is_dataset_name(toy)
    with pytest.raises(ConfigError, match=f"choose one of .*{toy}") as err:
        load_experiment(None, ["data.dataset=nope"])
    assert err.value.key == "data.dataset"
    with pytest.raises(ValueError, match=toy):
        load_dataset("nope")
    # config validation: its folder lives under data.path (no default root), 3 classes
    with pytest.raises(ConfigError, match=f"{toy} needs data.path") as err:
        load_experiment(None, [f"data.dataset={toy}"])
    assert err.value.key == "data.path"
    given = [f"data.dataset={toy}", f"data.path={tmp_path}"]
    too_many = ["data.partition=classes", "data.classes_per_client=4"]
    with pytest.raises(ConfigError, match=f"more than the 3 classes of {toy}") as err:
        load_experiment(None, [*given, *too_many])
    assert err.value.key == "data.classes_per_client"
    # the loader, by its dotted path
    bundle = load_dataset(toy, path=str(tmp_path))
    assert bundle.train.input_shape == TOY.input_shape and bundle.train.num_classes == 3
    # the pre-flight folder check (CLI and ServerApp)
    cfg = load_experiment(None, given)
    with pytest.raises(ConfigError, match="no toy-points-files/ folder there") as err:
        preflight(cfg)
    assert err.value.key == "data.path"
    (tmp_path / TOY.folder).mkdir()
    preflight(cfg)
    # FedGO's generator check takes the entry's shape without loading the data

    def no_loading(data):
        raise AssertionError("the data were loaded")

    monkeypatch.setattr(prefl, "load_bundle", no_loading)
    assert prefl.preflight_input_shape(cfg) == (2,)
    # the configuration page lists it under data.dataset
    page, _ = generate()
    line = next(p for p in page.split("\n- ") if p.startswith("`data.dataset`"))
    assert f"`{toy}` ({TOY.about})" in " ".join(line.split())
