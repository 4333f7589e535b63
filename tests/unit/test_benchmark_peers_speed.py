"""benchmarks/peers_speed.py and peers_setting.py: the experiment, the shared files and each
framework's translation on a tiny setting. Nothing here is timed or installed, and no peer
package is imported (the runners under benchmarks/peers/ are only read)."""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.benchmark_scripts import BENCHMARKS, load_benchmark

setting = load_benchmark("peers_setting")
speed = load_benchmark("peers_speed")

TINY = setting.Experiment(
    num_clients=4,
    clients_per_round=2,
    rounds=2,
    train_subset=None,
    test_subset=None,
    alpha=1.0,
    lr=0.1,
    batch_size=8,
    local_epochs=3,
)
PEER_PACKAGES = ("pfl", "flgo", "fedlab")


def _common():
    """benchmarks/peers/common.py, as the runners import it (torch and numpy only)."""
    spec = importlib.util.spec_from_file_location(
        "peers_common", BENCHMARKS / "peers" / "common.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory) -> Path:
    """A 10-class ImageFolder tree of 32x32 PNGs: 6 training and 2 test images a class."""
    from PIL import Image

    root = tmp_path_factory.mktemp("tree")
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 2)):
        for c in range(10):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def shared(image_tree, tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("shared")
    record = setting.export_shared(TINY, image_tree, folder)
    return folder, record


def _project_config(exp, data):
    from benchmarks.sweep import load_config

    return load_config(setting.PROJECT_CONFIG, setting.project_overrides(exp, data))


def test_the_runners_cnn_is_the_projects_cnn():
    from fedgo_flwr.models.classifiers import build_model

    torch.manual_seed(0)
    project = build_model("cnn", (3, 32, 32), 10)
    peers = _common().SmallCNN(10)
    peers.load_state_dict(project.state_dict())  # strict: same names and shapes
    assert sum(p.numel() for p in peers.parameters()) == 151_882
    x = torch.randn(5, 3, 32, 32)
    assert torch.equal(peers(x), project(x))


def test_shared_files_are_the_projects_partition_data_and_init(image_tree, shared):
    from fedgo_flwr.learning.task import load_bundle, make_partition, new_model, sample_clients

    folder, record = shared
    cfg = _project_config(TINY, image_tree)
    assert cfg.strategy.params.aggregation.rule == "mean"  # FedAvg's weighted mean, as the peers'
    partition = make_partition(cfg)
    assert record["clients"] == [c.tolist() for c in partition.clients]
    every = np.concatenate([np.asarray(c) for c in record["clients"]])
    assert sorted(every.tolist()) == list(range(60))  # all 60 images, each to one client
    assert record["schedule"] == [sample_clients(0, r, 4, 2) for r in (1, 2)]
    assert all(len(r) == 2 for r in record["schedule"])
    common = _common()
    loaded = common.Shared(folder)
    bundle = load_bundle(cfg.data)
    assert np.array_equal(loaded.train_x, bundle.train.x)
    assert np.array_equal(loaded.test_y, bundle.test.y) and len(loaded.test_y) == 20
    x, y = loaded.client_tensors(1)
    assert torch.equal(y, torch.from_numpy(bundle.train.y[partition.clients[1]]))
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    reference = new_model(cfg, bundle).state_dict()
    model = loaded.new_model().state_dict()
    assert all(torch.equal(model[k], reference[k]) for k in reference)


def test_the_project_modes_run_the_shared_experiment(tmp_path):
    data = tmp_path / "tree"
    launches = {
        m: setting.translate(m, TINY, tmp_path / "shared", tmp_path / m)
        for m in setting.PROJECT_MODES
    }
    assert launches["fedgo-flwr"].command[:2] == (
        str(setting.ROOT / "run.sh"),
        setting.PROJECT_CONFIG,
    )
    assert launches["fedgo-flwr-local"].command[1] == "--local"
    # --local trains as many clients side by side as the CPUs hold threads-sized workers
    workers = f"resources.local_workers={setting.local_workers(TINY)}"
    assert launches["fedgo-flwr-local"].command[-1] == workers
    assert not any("local_workers" in a for a in launches["fedgo-flwr"].command)
    assert setting.local_workers(TINY, cpus=2) == 2
    assert setting.local_workers(setting.Experiment(threads=2), cpus=8) == 4
    assert setting.local_workers(setting.Experiment(threads=4), cpus=2) == 1
    assert launches["fedgo-flwr-deploy"].command[0].endswith("deploy/local-federation.sh")
    for mode, launch in launches.items():
        assert launch.output_dir == tmp_path / mode / "out"
        assert f"output_dir={launch.output_dir}" in launch.command
    cfg = _project_config(TINY, data)
    assert (cfg.rounds, cfg.clients_per_round, cfg.data.num_clients) == (2, 2, 4)
    assert (cfg.train.lr, cfg.train.batch_size, cfg.train.local_epochs) == (0.1, 8, 3)
    assert (cfg.data.server_fraction, cfg.data.augment, cfg.model.name) == (0.0, False, "cnn")
    assert cfg.eval.every == 2 and cfg.strategy.name == "fedavg"
    assert cfg.resources.client_cpus == cfg.resources.server_cpus == TINY.threads


def test_a_deployment_of_many_clients_is_refused_by_name(tmp_path):
    big = setting.Experiment(num_clients=100, clients_per_round=10)
    with pytest.raises(setting.Unsupported, match="one SuperNode process per client"):
        setting.translate("fedgo-flwr-deploy", big, tmp_path, tmp_path / "run")


def _config(framework, tmp_path, exp=TINY):
    shared_dir = tmp_path / "shared"
    launch = setting.translate(
        framework, exp, shared_dir, tmp_path / framework, Path("/venv/python")
    )
    written = json.loads((tmp_path / framework / "setting.json").read_text())
    assert written["shared"] == str(shared_dir)
    assert written["experiment"]["rounds"] == exp.rounds
    runner = Path(launch.command[1])
    assert launch.command[0] == "/venv/python" and runner.parent == BENCHMARKS / "peers"
    assert runner.is_file() and launch.command[2] == str(tmp_path / framework)
    return written["config"]


def test_flower_gets_a_flower_app_with_fedavgs_settings(tmp_path):
    conf = _config("flower", tmp_path)
    app = tmp_path / "flower" / "flower_app"
    project = tomllib.loads((app / "pyproject.toml").read_text())
    assert project["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "flower_peer:server",
        "clientapp": "flower_peer:client",
    }
    assert project["tool"]["flwr"]["app"]["config"]["run-dir"] == str(tmp_path / "flower")
    assert (app / "flower_peer.py").is_file() and (app / "common.py").is_file()
    # Flower's FedAvg samples max(int(available * fraction_fit), min_fit_clients)
    assert int(TINY.num_clients * conf["fraction_fit"]) == conf["min_fit_clients"] == 2
    assert conf["min_available_clients"] == 4
    assert "num-supernodes=4" in conf["federation_config"]


def test_pfl_gets_fedavgs_settings(tmp_path):
    conf = _config("pfl", tmp_path)
    assert conf["central_num_iterations"] == 2 and conf["train_cohort_size"] == 2
    assert (conf["local_learning_rate"], conf["local_num_epochs"], conf["local_batch_size"]) == (
        0.1,
        3,
        8,
    )
    assert conf["evaluation_frequency"] == 2 and conf["val_cohort_size"] is None


def test_flgo_gets_an_option_dict_with_fedavgs_settings(tmp_path):
    conf = _config("flgo", tmp_path)
    assert int(TINY.num_clients * conf["proportion"]) == 2  # FLGo's clients_per_round
    assert (conf["num_rounds"], conf["num_epochs"], conf["batch_size"]) == (2, 3, 8)
    assert (conf["learning_rate"], conf["optimizer"], conf["momentum"]) == (0.1, "SGD", 0.0)
    assert conf["train_holdout"] == 0.0  # every client trains on its whole shard
    assert conf["sample"] == "uniform" and conf["eval_interval"] == 2


def test_fedlab_gets_its_arguments_and_refuses_momentum(tmp_path):
    conf = _config("fedlab", tmp_path)
    assert max(1, int(conf["sample_ratio"] * conf["num_clients"])) == 2
    assert (conf["global_round"], conf["epochs"], conf["batch_size"], conf["lr"]) == (2, 3, 8, 0.1)
    with pytest.raises(setting.Unsupported, match="momentum"):
        setting.translate("fedlab", setting.Experiment(momentum=0.9), tmp_path, tmp_path / "m")


@pytest.mark.parametrize(("m", "k"), [(15, 22), (13, 23), (10, 100), (5, 5), (1, 3)])
def test_every_framework_floors_the_fraction_back_to_m(m, k):
    f = setting.Experiment(num_clients=k, clients_per_round=m).fraction
    assert int(f * k) == m and int(f * k + 1e-9) == m and f <= 1.0
    assert int((m / k) * k) == m or (m, k) in {(15, 22), (13, 23)}  # why not m / k


def test_bad_experiments_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown experiment keys \\['round'\\]"):
        setting.load_experiment("tiny", ["round=3"])
    with pytest.raises(ValueError, match="clients_per_round \\(9\\) exceeds num_clients"):
        setting.load_experiment("tiny", ["clients_per_round=9"])
    with pytest.raises(ValueError, match="no shape or file"):
        setting.load_experiment(str(tmp_path / "missing.yaml"))
    (tmp_path / "e.yaml").write_text("num_clients: 6\nclients_per_round: 3\n")
    exp = setting.load_experiment(str(tmp_path / "e.yaml"), ["rounds=4"])
    assert (exp.num_clients, exp.clients_per_round, exp.rounds) == (6, 3, 4)


def test_round_times_and_the_table(tmp_path):
    run = speed.summarize_run({0: 2.0, 1: 5.0, 2: 7.0, 3: 9.5}, 3)
    assert run == {"wall_s": 9.5, "per_round_s": 2.25, "startup_s": 2.0, "first_round_s": 3.0}
    runs = [
        {
            "framework": "fedgo-flwr",
            "wall_s": 10.0,
            "per_round_s": 2.0,
            "startup_s": 4.0,
            "peak_tree_rss_mb": 900.0,
            "final_accuracy": 0.31,
        },
        {
            "framework": "fedgo-flwr",
            "wall_s": 14.0,
            "per_round_s": 2.0,
            "startup_s": 4.0,
            "peak_tree_rss_mb": 900.0,
            "final_accuracy": 0.33,
        },
        {
            "framework": "pfl",
            "wall_s": 6.0,
            "per_round_s": 1.0,
            "startup_s": 1.0,
            "peak_tree_rss_mb": 500.0,
            "final_accuracy": 0.3,
        },
        {"framework": "fedlab", "error": "pip install fedlab==1.3.0 failed: | no wheel"},
    ]
    runs[0]["load_before"], runs[2]["load_before"] = 1.5, 0.25
    text = speed.table({"experiment": {"rounds": 3}, "cpus": 2, "runs": runs})
    assert "load average before a run: 0.25 to 1.50 (2 CPUs)" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert rows["fedgo-flwr"].startswith("| fedgo-flwr | 2/2 | 12.0 |")
    assert rows["fedgo-flwr"].endswith("| 1.00 |")
    assert rows["pfl"].endswith("| 0.300 | 0.50 |")  # 6 / median(10, 14)
    assert (
        "0/1" in rows["fedlab"]
        and "error: pip install fedlab==1.3.0 failed: / no wheel" in (rows["fedlab"])
    )


def test_an_uninstalled_peer_is_an_error_row_not_a_run(tmp_path):
    (tmp_path / "flgo.error.txt").write_text("pip install flgo==0.4.4 failed: boom\n")
    record = speed.run_one("flgo", TINY, tmp_path, tmp_path / "run", tmp_path, 10.0)
    assert record == {"framework": "flgo", "error": "pip install flgo==0.4.4 failed: boom"}
    record = speed.run_one("pfl", TINY, tmp_path, tmp_path / "run", tmp_path, 10.0)
    assert "not installed" in record["error"] and not (tmp_path / "run").exists()


def test_no_peer_package_was_imported():
    assert not [name for name in PEER_PACKAGES if name in sys.modules]


@pytest.mark.parametrize("shape", sorted(setting.SHAPES))
def test_every_shape_translates_for_every_framework(shape, tmp_path):
    exp = setting.SHAPES[shape]
    cfg = _project_config(exp, tmp_path / "tree")
    assert (cfg.data.num_clients, cfg.clients_per_round) == (exp.num_clients, exp.clients_per_round)
    for framework in setting.FRAMEWORKS:
        too_many = framework == "fedgo-flwr-deploy" and exp.num_clients > setting.DEPLOY_MAX_NODES
        if too_many:
            with pytest.raises(setting.Unsupported):
                setting.translate(framework, exp, tmp_path, tmp_path / framework)
        else:
            setting.translate(framework, exp, tmp_path, tmp_path / framework)


def test_measure_sees_a_childs_memory_and_stops_it_at_the_timeout(tmp_path):
    import os
    import time

    grow = "import time; a = bytearray(200 * 2**20); a[::4096] = b'x' * len(a[::4096]); "
    grow += "time.sleep(1.0)"
    env = dict(os.environ)
    record = speed.measure([sys.executable, "-c", grow], env, tmp_path / "a.log", 60.0)
    assert record["exit"] == 0
    assert record["peak_process_rss_mb"] >= 200 and record["peak_tree_rss_mb"] >= 200
    started = time.monotonic()
    record = speed.measure(["sleep", "30"], env, tmp_path / "b.log", 0.3)
    assert record["exit"] == -15 and time.monotonic() - started < 10


def test_round_ends_read_the_runner_and_the_project_records(tmp_path):
    rows = [{"round": 0, "time": 102.0, "accuracy": 0.1}, {"round": 1, "time": 105.5}]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "result.json").write_text(json.dumps({"final_accuracy": 0.4}))
    got = speed.round_ends("fedlab", tmp_path, None, started=100.0)
    assert got == {"ends": {0: 2.0, 1: 5.5}, "trained": {}, "final_accuracy": 0.4, "initial": 0.1}
    rows[1].update(clients=[2, 0], images=7)
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = speed.round_ends("fedlab", tmp_path, None, started=100.0)
    assert got["trained"] == {1: {"clients": [2, 0], "images": 7}}
    out = tmp_path / "out"
    out.mkdir()
    rows = [{"round": 0, "elapsed": 3.0, "test_accuracy": 0.1}, {"round": 1, "elapsed": 7.0}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps({"final_accuracy": 0.3}))
    got = speed.round_ends("fedgo-flwr", tmp_path, out, started=100.0)
    assert got == {"ends": {0: 3.0, 1: 7.0}, "trained": {}, "final_accuracy": 0.3, "initial": 0.1}


def test_a_project_round_trains_the_schedules_images_when_every_client_replied(tmp_path):
    partition = {"clients": [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9]], "schedule": [[0, 3], [1, 2]]}
    rows = [
        {"round": 0, "elapsed": 3.0},
        {"round": 1, "elapsed": 7.0, "clients_sampled": 2, "clients_replied": 2},
        {"round": 2, "elapsed": 9.0, "clients_sampled": 2, "clients_replied": 1},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"final_accuracy": 0.3}))
    got = speed.round_ends("fedgo-flwr-local", tmp_path, tmp_path, 0.0, partition)
    # round 1: clients 0 and 3, 3 + 4 images; round 2 lost a reply: its images are unknown
    assert got["trained"] == {1: {"clients": [0, 3], "images": 7}}
    summary = speed.summarize_images(got["ends"], got["trained"], 2, partition["schedule"])
    assert summary["images_per_round"] == [7, None] and summary["followed_schedule"] is None
    assert summary["s_per_1000_images_rounds"] == [] and summary["s_per_1000_images"] is None


def test_seconds_per_1000_images_by_hand():
    ends = {0: 1.0, 1: 3.0, 2: 5.0, 3: 8.0}
    trained = {
        1: {"clients": [1, 0], "images": 200},
        2: {"clients": [2, 3], "images": 400},
        3: {"clients": [0, 2], "images": 250},
    }
    schedule = [[0, 1], [2, 3], [0, 2]]
    got = speed.summarize_images(ends, trained, 3, schedule)
    # round 2: 2 s / 400 images, round 3: 3 s / 250 images; round 1 (start-up) left out
    assert got["s_per_1000_images_rounds"] == [5.0, 12.0]
    assert got["s_per_1000_images"] == 8.5 and got["images_per_round"] == [200, 400, 250]
    assert got["followed_schedule"] is True  # the same clients, in any order
    trained[2] = {"clients": [2, 1], "images": 400}
    assert speed.summarize_images(ends, trained, 3, schedule)["followed_schedule"] is False


def test_the_table_pools_seconds_per_1000_images_over_rounds_and_repeats():
    def run(framework, per_1000, images, followed):
        median = sorted(per_1000)[len(per_1000) // 2] if per_1000 else None
        return {
            "framework": framework,
            "wall_s": 10.0,
            "per_round_s": 2.0,
            "s_per_1000_images_rounds": per_1000,
            "s_per_1000_images": median,
            "images_per_round": images,
            "followed_schedule": followed,
            "final_accuracy": 0.3,
        }

    results = {
        "experiment": {"rounds": 3},
        "runs": [
            run("fedgo-flwr", [5.0, 12.0], [200, 400, 250], True),
            run("fedgo-flwr", [6.0, 7.0], [200, 400, 250], True),
            run("pfl", [4.0, 4.5], [200, 400, 250], True),
            run("flower", [3.0, 9.0], [300, 100, 500], False),
            run("flgo", [1.0, 1.0], [1, 1, 1], True) | {"error": "exit 1: boom"},
        ],
    }
    text = speed.table(results)
    header = next(line for line in text.splitlines() if line.startswith("| framework"))
    titles = [t.strip() for t in header.strip("|").split("|")]
    at = titles.index("s per 1,000 images")
    assert titles[at - 1] == "per round after the first (s)"
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    cells = {
        f: [c.strip() for c in rows[f].strip("|").split("|")]
        for f in ("fedgo-flwr", "pfl", "flower")
    }
    # median of the four rounds 5, 12, 6, 7 (not of the runs' medians 8.5 and 6.5)
    assert cells["fedgo-flwr"][at] == "6.500"
    assert cells["pfl"][at] == "4.250" and cells["flower"][at] == "6.000"
    assert cells["fedgo-flwr"][at + 1] == "250"  # images a round: median of 200, 400, 250, ...
    notes = text.split("The clients of partition.json's schedule every round: ")[1]
    assert notes.startswith("fedgo-flwr, pfl; other clients (their own sampler): flower.")


def test_the_schedule_reaches_every_peers_run_folder(shared, tmp_path):
    folder, record = shared
    common = _common()
    followers = set(setting.FOLLOW_SCHEDULE) - set(setting.PROJECT_MODES)
    assert followers == {"pfl", "flgo", "fedlab"}
    for framework in setting.PEERS:
        setting.translate(framework, TINY, folder, tmp_path / framework, Path("/venv/python"))
        written = json.loads((tmp_path / framework / "setting.json").read_text())
        # the runner's Shared(setting["shared"]).schedule is the project's schedule
        assert common.Shared(written["shared"]).schedule == record["schedule"]
        conf = written["config"]
        asked = conf.get("user_sampler") == "schedule" or conf.get("schedule") is True
        assert asked == (framework in followers), framework
    assert _common().Shared(folder).images_of([0, 2]) == len(record["clients"][0]) + len(
        record["clients"][2]
    )


def test_the_runners_sampler_returns_the_schedule():
    common = _common()
    schedule = [[3, 1], [0, 2]]
    sampler = common.ScheduleSampler(schedule)  # pfl: one call per user of a cohort
    assert [sampler() for _ in range(4)] == [3, 1, 0, 2]
    with pytest.raises(RuntimeError, match="client slots are all used"):
        sampler()
    assert common.scheduled_clients(schedule, 1) == [3, 1]  # FLGo, FedLab: a round's clients
    assert common.scheduled_clients(schedule, 2) == [0, 2]
    for bad in (0, 3):
        with pytest.raises(ValueError, match=f"round {bad} is not in partition.json's schedule"):
            common.scheduled_clients(schedule, bad)


def test_the_projects_strategies_draw_the_schedule(image_tree, shared):
    from types import SimpleNamespace

    from strategies._sending import Outbox

    _, record = shared
    cfg = _project_config(TINY, image_tree)
    outbox = SimpleNamespace(cfg=cfg)  # Outbox.sample reads only the config
    drawn = [Outbox.sample(outbox, r) for r in range(1, TINY.rounds + 1)]
    assert drawn == record["schedule"]


def test_the_end_of_round_1_is_start_up_plus_the_first_round():
    """A framework that starts its workers in round 1 (the plain Flower app) and one that starts
    them before it (the project's node discovery) compare on start-up plus the first round."""
    runs = [
        {"framework": "fedgo-flwr", "wall_s": 30.0, "startup_s": 15.0, "first_round_s": 5.0},
        {"framework": "fedgo-flwr", "wall_s": 30.0, "startup_s": 19.0, "first_round_s": 6.0},
        {"framework": "flower", "wall_s": 30.0, "startup_s": 11.0, "first_round_s": 13.0},
        {"framework": "pfl", "wall_s": 30.0, "startup_s": 5.0},  # no first round recorded
    ]
    text = speed.table({"experiment": {"rounds": 2}, "runs": runs})
    lines = text.splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    col = header.index("to the end of round 1 (s)")
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[4:] if line.startswith("|")}

    def cell(name: str) -> str:
        return [c.strip() for c in rows[name].strip("|").split("|")][col]

    assert header[col - 1] == "start-up (s)"
    assert cell("fedgo-flwr") == "22.5"  # median of 20 and 25
    assert cell("flower") == "24.0"
    assert cell("pfl") == "-"
