"""The figures (fedgo_flwr.records.plots): what their titles, labels, legends and bands say,
read from matplotlib's artists, on runs written by hand."""

from __future__ import annotations

import math
import statistics

import pytest
import yaml
from matplotlib.collections import PolyCollection

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.records import plots
from fedgo_flwr.records.plots import (
    metric_label,
    plot_accuracy,
    plot_curves,
    plot_partition,
    plot_partitions,
    setting,
)
from fedgo_flwr.records.report import Run


def config(**changes) -> dict:
    """The default config as ``config.yaml`` holds it, with ``section__key=value`` changes."""
    raw = ExperimentConfig().to_dict()
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        section = raw
        for key in path:
            section = section[key]
        section[last] = value
    return raw


def make_run(tmp_path, name, accs, seed=0, strategy="fedavg", cfg=None, **series) -> Run:
    """A run whose round r has test accuracy ``accs[r]`` and ``series[key][r]`` for other keys
    (``...`` leaves the key out of that row)."""
    rows = []
    for r, acc in enumerate(accs):
        row = {"round": r, "test_accuracy": acc}
        row.update({k: v[r] for k, v in series.items() if v[r] is not ...})
        rows.append(row)
    hist = [[3, 0, 1], [0, 4, 2]]
    return Run(tmp_path / name, name, strategy, seed, rows, {}, {"class_histogram": hist}, cfg)


@pytest.fixture
def figures(monkeypatch):
    """The figures the plots write, kept open for the test to read."""
    kept = []
    save = plots._save

    def keep(fig, path, *dpi):
        kept.append(fig)
        save(fig, path, *dpi)

    monkeypatch.setattr(plots, "_save", keep)
    return kept


def texts(fig) -> list[str]:
    """Every text of a figure: titles, axis labels, legend entries, notes."""
    found = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in found if t]


def bands(ax) -> list[tuple[float, float]]:
    """Per band of ``ax`` the lowest and highest value it covers."""
    out = []
    for band in ax.collections:
        if isinstance(band, PolyCollection):
            ys = [y for path in band.get_paths() for _, y in path.vertices]
            out.append((min(ys), max(ys)))
    return out


# -- the setting -----------------------------------------------------------------------------


def test_the_setting_of_the_default_config():
    assert setting([config()]) == (
        "digits · Dirichlet α=0.1 · 20 clients · 8 per round · 40 rounds · cnn"
    )


def test_a_part_the_runs_differ_in_is_mixed_with_its_values():
    configs = [config(rounds=3), config(rounds=40, data__alpha=0.5), config(rounds=40)]
    assert setting(configs) == (
        "digits · partition mixed (Dirichlet α=0.1, Dirichlet α=0.5) · 20 clients · "
        "8 per round · rounds mixed (3, 40) · cnn"
    )
    many = [config(rounds=r) for r in (1, 2, 3, 4, 5)]
    assert "rounds mixed ·" in setting(many)  # beyond four values, no list
    assert "rounds mixed (3, ?)" in setting([config(rounds=3), {"data": {"dataset": "digits"}}])


def test_other_partitions_and_configs_without_a_setting():
    classes = config(data__partition="classes", data__classes_per_client=2)
    assert "2 classes per client" in setting([classes])
    prior = config(data__partition="dirichlet_prior", data__quantity_sigma=0.5)
    assert "Dirichlet prior α=0.1, σ=0.5" in setting([prior])
    assert setting([{}]) == setting([]) == "setting not recorded"
    odd = {"data": {"dataset": ["a"], "num_clients": "x"}, "rounds": {"x": 1}, "fraction": True}
    assert setting([odd, "not a mapping"]) == "clients mixed (x, ?)"


@pytest.mark.parametrize(("k", "fraction", "least"), [(20, 0.4, 1), (10, 0.1, 3), (7, 0.3, 1)])
def test_clients_per_round_is_the_configs_own(k, fraction, least):
    cfg = ExperimentConfig()
    cfg.data.num_clients, cfg.fraction, cfg.min_clients = k, fraction, least
    expected = f"{cfg.clients_per_round} per round"
    assert expected in setting([cfg.to_dict()])


def test_axis_names_are_words_and_accuracies_are_percent():
    assert metric_label("test_accuracy") == "test accuracy (%)"
    assert metric_label("ensemble_accuracy_uniform") == "ensemble accuracy uniform (%)"
    assert metric_label("test_loss") == "test loss"
    assert metric_label("kd_loss") == "kd loss"


# -- the report's figure ---------------------------------------------------------------------


def test_the_report_figure_says_its_setting_n_and_percent(tmp_path, figures):
    cfg = config()
    runs = [
        make_run(tmp_path, f"fedavg-seed{s}", accs, seed=s, cfg=cfg, test_loss=[2.0, 1.0 + s])
        for s, accs in enumerate([[0.1, 0.5], [0.2, 0.7], [0.3, 0.9]])
    ]
    plot_accuracy({"fedavg": runs}, tmp_path / "accuracy.png")
    assert (tmp_path / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    title = fig.get_suptitle()
    assert "digits · Dirichlet α=0.1 · 20 clients · 8 per round · 40 rounds" in title
    assert "fedavg (n=3 seeds)" in texts(fig)
    acc, loss, traffic, wall = fig.axes[:4]
    assert acc.get_ylabel() == "test accuracy (%)" and loss.get_ylabel() == "test loss"
    assert not [t for t in texts(fig) if "test_accuracy" in t or "test_loss" in t]
    (line,) = acc.get_lines()
    assert list(line.get_xdata()) == [0, 1]
    assert list(line.get_ydata()) == pytest.approx([20.0, 70.0])  # mean over seeds, in %
    ((lo, hi),) = bands(acc)  # +- one sd: round 0's low end, round 1's high end
    assert lo == pytest.approx(20.0 - 100 * statistics.stdev([0.1, 0.2, 0.3]))
    assert hi == pytest.approx(70.0 + 100 * statistics.stdev([0.5, 0.7, 0.9]))
    assert list(loss.get_lines()[0].get_ydata()) == pytest.approx([2.0, 2.0])
    for ax, what in ((traffic, "its traffic"), (wall, "its wall time")):
        assert f"no run recorded {what}" in texts(ax) and not ax.get_lines()


def test_bands_stay_within_0_and_100_and_a_loss_above_0(tmp_path, figures):
    low = [make_run(tmp_path, f"low{s}", [a], seed=s, test_loss=[v]) for s, (a, v) in
           enumerate([(0.0, 0.0), (0.0, 0.0), (0.3, 3.0)])]  # fmt: skip
    high = [make_run(tmp_path, f"high{s}", [a], seed=s) for s, a in enumerate([1.0, 1.0, 0.4])]
    plot_accuracy({"low": low, "high": high}, tmp_path / "accuracy.png")
    acc, loss = figures[0].axes[:2]
    spans = bands(acc)
    assert min(lo for lo, _ in spans) == 0.0 and max(hi for _, hi in spans) == 100.0  # clipped
    assert bands(loss)[0][0] == 0.0
    assert acc.get_ylim()[0] >= -2 and acc.get_ylim()[1] <= 102


def test_traffic_and_wall_time_panels_are_cumulative_mb_and_elapsed(tmp_path, figures):
    run = make_run(
        tmp_path, "a", [0.1, 0.4, 0.6], bytes_down=[5e5, 1e6, 1e6], bytes_up=[0, 2e6, ...],
        elapsed=[0.5, 3.0, 6.5],
    )  # fmt: skip
    plot_accuracy({"a": [run]}, tmp_path / "accuracy.png")
    traffic, wall = figures[0].axes[2:4]
    assert list(traffic.get_lines()[0].get_xdata()) == pytest.approx([0.5, 3.5, 4.5])
    assert list(wall.get_lines()[0].get_xdata()) == pytest.approx([0.5, 3.0, 6.5])
    assert list(wall.get_lines()[0].get_ydata()) == pytest.approx([10.0, 40.0, 60.0])
    assert not bands(wall)  # one run: no band


def test_one_run_of_one_round_with_nan_and_missing_values(tmp_path, figures):
    single = make_run(tmp_path, "one", [0.25], seed=None)
    gaps = make_run(tmp_path, "gaps", [0.1, math.nan, None, "x", 0.5], test_loss=[math.inf] * 5)
    plot_accuracy({"one": [single], "gaps": [gaps]}, tmp_path / "accuracy.png")
    acc, loss = figures[0].axes[:2]
    one, kept = acc.get_lines()
    assert list(one.get_xdata()) == [0] and list(one.get_ydata()) == [25.0]
    assert list(kept.get_xdata()) == [0, 4]  # NaN, None and a string left out
    assert "no run recorded a test loss" in texts(loss)
    assert figures[0].get_suptitle() == "setting not recorded"
    assert "one (fedavg, n=1 run, seed unknown)" in texts(figures[0])


def test_the_legend_says_what_a_group_pools(tmp_path, figures):
    same_seed = [make_run(tmp_path, f"r{i}", [0.1, 0.2], seed=0) for i in range(2)]
    methods = [
        make_run(tmp_path, "x", [0.1, 0.3], seed=0, strategy="fedavg"),
        make_run(tmp_path, "y", [0.1, 0.3], seed=0, strategy="feddf"),
    ]
    plot_accuracy({"fedavg": same_seed, "seed0": methods}, tmp_path / "accuracy.png")
    entries = texts(figures[0])
    assert "fedavg (n=2 runs, 1 seed)" in entries
    assert "seed0 (mixed: fedavg, feddf; n=2 runs, 1 seed)" in entries


def test_groups_of_different_settings_say_theirs_in_the_legend(tmp_path, figures):
    a = make_run(tmp_path, "a", [0.1, 0.2], cfg=config(rounds=3))
    b = make_run(tmp_path, "b", [0.1, 0.2], ensemble_test_accuracy=[..., 0.3], cfg=config())
    plot_accuracy({"a": [a], "b": [b]}, tmp_path / "accuracy.png")
    fig = figures[0]
    assert "rounds mixed (3, 40)" in fig.get_suptitle()
    assert "a (fedavg, n=1 seed): 3 rounds" in texts(fig)
    assert "dashed: client ensemble" in texts(fig)
    dashed = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == pytest.approx([30.0])


# -- partitions ------------------------------------------------------------------------------


def test_a_partition_is_titled_by_its_setting_not_its_folder(tmp_path, figures):
    run = make_run(tmp_path, "20261203-090000", [0.1], seed=4, cfg=config(data__alpha=0.5))
    assert plot_partition(run, tmp_path / "p.png", ["fedavg", "feddf"])
    title = figures[0].axes[0].get_title()
    assert title == (
        "samples per client and class\ndigits · Dirichlet α=0.5 · 20 clients, seed 4\n"
        "the partition of fedavg, feddf"
    )
    assert "20261203" not in " ".join(texts(figures[0]))
    cells = sorted(t.get_text() for t in figures[0].axes[0].texts)
    assert cells == ["1", "2", "3", "4"]  # the counts, empty cells blank


def test_one_heatmap_per_distinct_partition(tmp_path, figures):
    a, b = make_run(tmp_path, "a", [0.1]), make_run(tmp_path, "b", [0.1])
    c = make_run(tmp_path, "c", [0.1])
    c.partition = {"class_histogram": [[1, 1]]}
    empty = make_run(tmp_path, "d", [0.1])
    empty.partition = None
    written = plot_partitions({"a": [a], "b": [b], "c": [c], "d": [empty]}, tmp_path)
    assert written == [tmp_path / "partition-a.png", tmp_path / "partition-c.png"]
    assert figures[0].axes[0].get_title().endswith("the partition of a, b")


# -- the sweep's curves ----------------------------------------------------------------------


def sweep_table(metric="test_accuracy", **curves) -> dict:
    note = "tuning seeds: not for claims"
    return {
        "metric": metric,
        "level": 0.95,
        "seed_set": {"name": "tuning", "seeds": [0, 1, 2], "note": note},
        "variants": [{"name": k, "seeds_finished": [0, 1]} for k in curves],
        "curves": curves,
    }


BAND = {"round": [0, 1], "n": [2, 2], "mean": [0.05, 0.5], "ci_low": [-0.3, 0.2],
        "ci_high": [0.4, 1.4]}  # fmt: skip


def test_the_sweep_curves_are_percent_in_0_100_titled_by_setting(tmp_path, figures):
    for seed, rounds in ((0, 3), (1, 3)):
        folder = tmp_path / "fedavg" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump(config(rounds=rounds, seed=seed)))
    plot_curves(sweep_table(fedavg=BAND), tmp_path / "curves.png", runs_dir=tmp_path)
    ax = figures[0].axes[0]
    assert ax.get_ylabel() == "test accuracy (%)"
    assert ax.get_title().startswith("digits · Dirichlet α=0.1 · 20 clients · 8 per round · 3")
    assert "test accuracy (%): mean and 95% CI over seeds" in ax.get_title()
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([5.0, 50.0])
    assert bands(ax) == [(0.0, 100.0)]  # -30% and 140% clipped
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fedavg (n=2 seeds)"]
    assert not [t for t in texts(figures[0]) if "test_accuracy" in t]


def test_sweep_curves_of_a_loss_of_missing_values_and_of_nothing(tmp_path, figures):
    gappy = {"round": [0, 1, 2], "n": [1, 3, 2], "mean": [None, 2.0, 1.0],
             "ci_low": [None, -1.0, None], "ci_high": [None, 5.0, None]}  # fmt: skip
    empty = {"round": [], "n": [], "mean": [], "ci_low": [], "ci_high": []}
    plot_curves(sweep_table("test_loss", a=gappy, b=empty), tmp_path / "curves.png")
    ax = figures[0].axes[0]
    assert ax.get_ylabel() == "test loss"
    assert list(ax.get_lines()[0].get_ydata()) == [2.0, 1.0]  # not scaled
    assert bands(ax) == [(0.0, 5.0)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a (n=2-3 seeds)"]
    plot_curves(sweep_table(b=empty), tmp_path / "none.png", runs_dir=tmp_path / "absent")
    assert (tmp_path / "none.png").is_file() and not figures[1].axes[0].get_lines()


@pytest.mark.parametrize("text", ["a: [\n", "- 1\n", "[" * 5000 + "]" * 5000, b"\xff\xfe"])
def test_a_sweep_run_config_that_cannot_be_read_is_left_out_of_the_title(tmp_path, figures, text):
    good, bad = tmp_path / "fedavg" / "seed0", tmp_path / "fedavg" / "seed1"
    good.mkdir(parents=True)
    bad.mkdir(parents=True)
    (good / "config.yaml").write_text(yaml.safe_dump(config(rounds=3)))
    if isinstance(text, bytes):
        (bad / "config.yaml").write_bytes(text)
    else:
        (bad / "config.yaml").write_text(text)
    plot_curves(sweep_table(fedavg=BAND), tmp_path / "curves.png", runs_dir=tmp_path)
    assert figures[0].axes[0].get_title().startswith("digits · Dirichlet α=0.1 · 20 clients")
    assert "3 rounds" in figures[0].axes[0].get_title()
