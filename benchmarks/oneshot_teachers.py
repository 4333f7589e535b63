"""How strong do the one-shot clients' models get with more local epochs? (issue 51)

Co-Boosting (Dai et al., ICLR 2024; paper 004, Table 2) reports a uniform ensemble of the ten
clients' models (FedENS) at 49.99% on CIFAR-10, Dir(0.1), after 300 local epochs at batch 128;
the project's CPU preset gives 18-32%, and a data-free student cannot beat its teachers. This
script measures the teachers' strength against the local epochs, for the one-shot clients of
a config (default ``conf/bench/coboosting-cifar10-paper.yaml``: the paper's data and local
training), so that the epochs a CPU can afford are chosen on the tuning seeds before the
report seeds' teachers are trained.

Each client trains exactly as in the one-shot clients' round (:class:`clients.base.ClientAlgorithm`,
``fedgo_flwr.learning.training.train_local``): the same images (``make_partition``), the
server's initial model (``new_model``), the optimizer of ``train`` and the random stream of the
round's train message (``make_rng(seed, "train", 1, k)``), one epoch per call with the same
optimizer and stream. The local learning rate is constant, so the model after ``E`` epochs of a
longer training is the ``E``-epoch model bit for bit (a test checks it against the one-shot
run's upload). The clients train milestone by milestone (all ten to 10 epochs, then to 20, ...),
and at each milestone the test set measures: the clients' own accuracies, their parameter
average (one-shot FedAvg), FedENS (uniform weights) and DW-FedENS (weights ``n_k``), the two
ensembles of the paper's Table 2 (logits averaged, Eq. 2). Each milestone's models are also
written as a one-shot run's uploads (``seed<N>/e<E>/client_models.pt``, made for the config with
``train.local_epochs=E``), so any one-shot server method can start from them
(``strategy.teachers_from``).

After every epoch a client's state (model, optimizer, random stream, losses) is saved
atomically in ``--work``, so a stopped run goes on from the last epoch; the models at each
milestone are kept beside it. State saved under other settings is refused, naming the file.
``resources.channels_last=true`` trains in the channels-last memory format (faster on a CPU,
other float rounding: a one-shot run with the same switch uploads the same models).

    python -m benchmarks.oneshot_teachers --seeds 0 [--epochs 10 20 40 80 150 300] \
        [--config F] [--work DIR] [--out DIR] [--threads 1] [k=v ...]

Writes ``table.md`` and ``summary.json`` to ``--out`` after each milestone. Accuracy only:
it may run niced beside other work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.datafree import weighted_logits
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import make_optimizer, predict_logits, train_local
from fedgo_flwr.runtime.fileio import atomic_torch_save, atomic_write_text
from fedgo_flwr.runtime.kernels import use_channels_last
from fedgo_flwr.runtime.rng import make_rng
from strategies import load_experiment
from strategies.oneshot import UPLOADS_FILE, fingerprint

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "conf/bench/coboosting-cifar10-paper.yaml"
EPOCHS = (10, 20, 40, 80, 150, 300)
BATCH = 500
ROUND = 1  # the one-shot clients' round
PAPER_FEDENS = 49.99  # paper 004, Table 2: CIFAR-10, alpha 0.1, 10 clients


class StaleState(ValueError):
    """A saved client state made under other settings than this run's."""


def settings(cfg: ExperimentConfig) -> dict:
    """What a client's training depends on: the data, model, local training and seed, and the
    convolutions' memory format (``resources.channels_last``: the same math, other float
    rounding, so one client's epochs are never trained in two formats)."""
    whole = json.loads(cfg.to_json(strategy_params=False))
    out = {key: whole[key] for key in ("data", "model", "train", "seed")}
    return {**out, "channels_last": cfg.resources.channels_last}


class Client:
    """One client's training, epoch by epoch, resumable from its state file."""

    def __init__(self, cfg: ExperimentConfig, pid: int, data, work: Path):
        self.cfg, self.pid, self.data, self.work = cfg, pid, data, work
        self.state_file = work / f"client{pid}.pt"
        self.model = new_model(cfg, load_bundle(cfg.data))
        self.optimizer = make_optimizer(self.model.parameters(), cfg.train)
        self.rng = make_rng(cfg.seed, "train", ROUND, pid)
        self.settings = settings(cfg)
        self.losses, self.seconds = [], []  # one entry per epoch done
        if self.state_file.is_file():
            saved = torch.load(self.state_file, weights_only=False)
            if saved["settings"] != self.settings:
                raise StaleState(
                    f"{self.state_file}: saved under other settings than this run's "
                    "(remove it, or give this run another --work)"
                )
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.rng.set_state(saved["rng"])
            self.losses, self.seconds = saved["losses"], saved["seconds"]

    @property
    def epoch(self) -> int:
        """The local epochs done."""
        return len(self.losses)

    def train_to(self, epochs: int) -> None:
        """Train on until ``epochs`` local epochs are done, saving the state after each."""
        one = dataclasses.replace(self.cfg.train, local_epochs=1)
        device = torch.device("cpu")
        while self.epoch < epochs:
            stats = train_local(
                self.model, self.data, one, rng=self.rng, device=device,
                augment=self.cfg.data.augment, optimizer=self.optimizer,
            )  # fmt: skip
            self.losses.append(stats.loss)
            self.seconds.append(stats.seconds)
            atomic_torch_save(self.state_file, {
                "settings": self.settings, "epoch": self.epoch,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": self.rng.get_state(), "losses": self.losses, "seconds": self.seconds,
            })  # fmt: skip
        milestone = self.work / f"client{self.pid}-e{epochs}.pt"
        if self.epoch == epochs and not milestone.is_file():
            atomic_torch_save(
                milestone, {"settings": self.settings, "model": self.model.state_dict()}
            )

    def milestone(self, epochs: int) -> dict[str, torch.Tensor]:
        """The model after ``epochs`` local epochs (kept when they were reached)."""
        return torch.load(self.work / f"client{self.pid}-e{epochs}.pt")["model"]


def measure(cfg: ExperimentConfig, clients: list[Client], epochs: int) -> dict:
    """The teachers after ``epochs`` local epochs, on the test set."""
    bundle = load_bundle(cfg.data)
    labels = torch.as_tensor(bundle.test.y, dtype=torch.long)
    states = [c.milestone(epochs) for c in clients]
    model = new_model(cfg, bundle)
    logits = []
    for state in states:
        model.load_state_dict(state)
        logits.append(predict_logits(model.eval(), bundle.test, BATCH, "cpu").float())
    stacked = torch.stack(logits)
    sizes = torch.tensor([len(c.data) for c in clients], dtype=torch.float64)

    def accuracy(z: torch.Tensor) -> float:
        return 100 * float((z.argmax(1) == labels).float().mean())

    share = (sizes / sizes.sum()).tolist()  # one-shot FedAvg: weights n_k, as the strategy's
    average = {
        k: sum(w * s[k].double() for w, s in zip(share, states, strict=True)).to(states[0][k].dtype)
        for k in states[0]
    }
    model.load_state_dict(average)
    own = [accuracy(z) for z in logits]
    return {
        "epochs": epochs,
        "clients": [round(a, 2) for a in own],
        "clients_mean": sum(own) / len(own),
        "fedavg": accuracy(predict_logits(model.eval(), bundle.test, BATCH, "cpu").float()),
        "fedens": accuracy(weighted_logits(stacked, torch.ones(len(states)))),
        "dw_fedens": accuracy(weighted_logits(stacked, sizes)),
        "last_loss": sum(c.losses[epochs - 1] for c in clients) / len(clients),
        # cumulative over the clients, on a loaded machine: not a timing
        "train_seconds": sum(sum(c.seconds[:epochs]) for c in clients),
    }


def write_uploads(cfg: ExperimentConfig, clients: list[Client], epochs: int) -> Path:
    """The models after ``epochs`` epochs as the one-shot round's ``client_models.pt`` of
    ``cfg`` with ``train.local_epochs = epochs`` (every client sampled, none left out); its
    folder."""
    trained = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, local_epochs=epochs))
    pids = [c.pid for c in clients]
    folder = clients[0].work / f"e{epochs}"
    folder.mkdir(exist_ok=True)
    uploads = {str(c.pid): {"size": len(c.data), "state": c.milestone(epochs)} for c in clients}
    atomic_torch_save(folder / UPLOADS_FILE, {
        "fingerprint": fingerprint(trained), "extra_fingerprint": None, "clients": uploads,
        "left_out": [], "sampled": pids, "arrival": pids,
    })  # fmt: skip
    return folder


def table(config: str, results: dict[int, list[dict]], overrides: Sequence[str] = ()) -> str:
    given = " ".join(f"`{o}`" for o in overrides)
    lines = [
        "# One-shot clients' models against their local epochs (oneshot_teachers.py)",
        "",
        f"`{config}`{' with ' + given if given else ''}; test accuracy %. "
        "FedENS: the uniform ensemble (logits averaged); "
        f"DW-FedENS: weights n_k; the paper's FedENS {PAPER_FEDENS} "
        "(Table 2, CIFAR-10, alpha 0.1).",
        "",
        "| local epochs | seed | clients: mean (min-max) | one-shot FedAvg | FedENS | DW-FedENS "
        "| last epoch's CE (mean) |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    rows = sorted((r["epochs"], seed, r) for seed, rs in results.items() for r in rs)
    for epochs, seed, r in rows:
        lines.append(
            f"| {epochs} | {seed} | {r['clients_mean']:.2f} ({min(r['clients']):.2f}-"
            f"{max(r['clients']):.2f}) | {r['fedavg']:.2f} | {r['fedens']:.2f} | "
            f"{r['dw_fedens']:.2f} | {r['last_loss']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def run_seed(config: str, seed: int, milestones: Sequence[int], overrides: Sequence[str],
             work: Path, report) -> list[dict]:  # fmt: skip
    """Every milestone of one seed, in order; ``report(seed, results)`` after each."""
    cfg = load_experiment(config, [*overrides, f"seed={seed}"])
    use_channels_last(cfg.resources.channels_last)
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    folder = work / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    clients = [Client(cfg, k, bundle.train.subset(idx), folder)
               for k, idx in enumerate(partition.clients)]  # fmt: skip
    done = folder / "milestones.json"
    results = json.loads(done.read_text()) if done.is_file() else []
    measured = {r["epochs"] for r in results}
    for epochs in milestones:
        if epochs not in measured:
            start = time.perf_counter()
            for client in clients:
                client.train_to(epochs)
            results.append(measure(cfg, clients, epochs))
            atomic_write_text(done, json.dumps(results, indent=1) + "\n")
            print(
                f"oneshot_teachers: seed {seed}, {epochs} epochs: FedENS "
                f"{results[-1]['fedens']:.2f}% ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            report(seed, results)
        if not (folder / f"e{epochs}" / UPLOADS_FILE).is_file():
            write_uploads(cfg, clients, epochs)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", nargs="+", type=int, default=list(EPOCHS))
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "oneshot-teachers")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/oneshot-teachers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="k=v config overrides")
    args = parser.parse_args(argv)
    if sorted(set(args.epochs)) != args.epochs or args.epochs[0] < 1:
        parser.error("--epochs: increasing positive numbers")
    torch.set_num_threads(args.threads)
    results: dict[int, list[dict]] = {}

    def report(seed: int, seed_results: list[dict]) -> None:
        results[seed] = seed_results
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"config": args.config, "overrides": args.overrides, "seeds": results}
        atomic_write_text(args.out / "summary.json", json.dumps(payload, indent=1) + "\n")
        atomic_write_text(args.out / "table.md", table(args.config, results, args.overrides))

    for seed in args.seeds:
        try:
            report(
                seed, run_seed(args.config, seed, args.epochs, args.overrides, args.work, report)
            )
        except StaleState as exc:
            print(f"oneshot_teachers: {exc}", file=sys.stderr)
            return 2
    print(table(args.config, results, args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
