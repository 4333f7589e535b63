"""The pfl-research peer: ``FederatedAveraging`` on a ``SimulatedBackend``, pfl's own local SGD.

``python pfl_runner.py RUN_DIR`` (pfl's venv). The users are the clients of ``partition.json``,
a ``FederatedDataset`` of ``train_cohort_size`` users a central iteration. Its user sampler,
pfl's extension point (a callable with no argument returning one user id, called once per user
of a cohort), is ``common.ScheduleSampler`` when the config says ``user_sampler: schedule``:
iteration ``r`` then trains exactly the clients ``schedule[r - 1]`` of ``partition.json``, as
the project does; any other name is one of pfl's own samplers (``get_user_sampler``). The users
a cohort actually made (``make_dataset``) and their images are recorded per iteration in
``rounds.jsonl``. Each user's data is shuffled when its dataset is made (pfl's local loop walks
a dataset in order). The central optimiser is SGD with
learning rate 1 on the averaged model difference, weighted by data points
(``WeightByDatapoints``): FedAvg. Central evaluation with ``common.evaluate`` before the first
and after the last iteration, from a pfl callback.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from common import (
    Clock,
    ScheduleSampler,
    Shared,
    SmallCNN,
    evaluate,
    load_setting,
    run_dir_from_argv,
    set_threads,
)
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.internal.ops.selector import set_framework_module
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch.nn import functional as F


class PflCNN(SmallCNN):
    """:class:`SmallCNN` with the ``loss`` and ``metrics`` methods pfl's ``PyTorchModel`` needs."""

    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=False):  # noqa: A002
        self.eval() if eval else self.train()
        logits = self(x)
        loss = float(F.cross_entropy(logits, y, reduction="sum"))
        correct = int((logits.argmax(1) == y).sum())
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


class Rounds(TrainingProcessCallback):
    """Times every central iteration, with the users it trained (``made``: the ids
    ``make_dataset`` was asked for since the last iteration, emptied here) and their images;
    evaluates before the first and after the last."""

    def __init__(
        self, clock: Clock, shared: Shared, rounds: int, batch: int, made: list[int]
    ) -> None:
        self.clock, self.rounds, self.batch = clock, rounds, batch
        self.shared, self.made = shared, made
        self.x, self.y = shared.test_tensors()

    def on_train_begin(self, *, model):
        acc, _ = evaluate(model._model, self.x, self.y, self.batch)
        self.clock.round_done(0, accuracy=acc)
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        done = central_iteration + 1
        trained = {"clients": list(self.made), "images": self.shared.images_of(self.made)}
        self.made.clear()
        if done == self.rounds:
            acc, loss = evaluate(model._model, self.x, self.y, self.batch)
            self.clock.round_done(done, accuracy=acc, **trained)
            self.clock.finish(acc, loss)
        else:
            self.clock.round_done(done, **trained)
        return False, Metrics()


def main() -> None:
    run_dir = run_dir_from_argv()
    setting = load_setting(run_dir)
    exp, conf = setting["experiment"], setting["config"]
    set_threads(exp["threads"])
    torch.manual_seed(exp["seed"])
    np.random.seed(exp["seed"])
    set_framework_module(__import__("pfl.internal.ops.pytorch_ops", fromlist=["x"]))
    shared = Shared(setting["shared"])
    rng = np.random.default_rng(exp["seed"])
    made: list[int] = []  # the users of the current central iteration

    def make_dataset(user_id):
        made.append(int(user_id))
        x, y = shared.client_tensors(int(user_id))
        order = torch.from_numpy(rng.permutation(len(y)))
        return Dataset(raw_data=[x[order], y[order]], user_id=str(user_id))

    user_ids = list(range(exp["num_clients"]))
    if conf["user_sampler"] == "schedule":
        sampler = ScheduleSampler(shared.schedule)
    else:
        sampler = get_user_sampler(conf["user_sampler"], user_ids)
    train = FederatedDataset(make_dataset, sampler)
    net = PflCNN(shared.num_classes)
    net.load_state_dict(shared.new_model().state_dict())
    model = PyTorchModel(
        model=net,
        local_optimizer_create=functools.partial(
            torch.optim.SGD,
            momentum=conf["local_momentum"],
            weight_decay=conf["local_weight_decay"],
        ),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    backend = SimulatedBackend(
        training_data=train, val_data=train, postprocessors=[WeightByDatapoints()]
    )
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=conf["central_num_iterations"],
        evaluation_frequency=conf["evaluation_frequency"],
        train_cohort_size=conf["train_cohort_size"],
        val_cohort_size=conf["val_cohort_size"],
    )
    train_params = NNTrainHyperParams(
        local_learning_rate=conf["local_learning_rate"],
        local_num_epochs=conf["local_num_epochs"],
        local_batch_size=conf["local_batch_size"],
    )
    eval_params = NNEvalHyperParams(local_batch_size=exp["eval_batch_size"])
    clock = Clock(run_dir)
    FederatedAveraging().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=eval_params,
        callbacks=[Rounds(clock, shared, exp["rounds"], exp["eval_batch_size"], made)],
    )


if __name__ == "__main__":
    main()
