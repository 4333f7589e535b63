"""The prose of ``docs/configuration.md`` that is not in the configuration dataclasses: the
descriptions of keys without an attribute docstring (:data:`NOTES`), the page's introduction
(:data:`INTRO`) and the rules every key obeys (:data:`RULES`). Read by
:mod:`docs.gen_configuration`, which renders the page.
"""

from __future__ import annotations

NOTES: dict[str, str] = {
    # ExperimentConfig (top-level keys)
    "ExperimentConfig.name": "Run name: the prefix of the run's log lines, and the folder "
    "`outputs/<name>/` of its runs when `output_dir` is not set. Never a control character "
    "(newline, NUL, ...), whatever `output_dir`.",
    "ExperimentConfig.seed": "Seeds the partition, the model's initialisation, client sampling "
    "and client training; every random draw of a round is derived from `(seed, round, ...)`.",
    "ExperimentConfig.rounds": "Federated rounds (for CPFL: the most rounds a cohort runs; the "
    "one-shot strategies need 1).",
    "ExperimentConfig.fraction": "Share of the clients sampled each round: "
    "`max(min_clients, floor(fraction * data.num_clients))`.",
    "ExperimentConfig.min_clients": "A round needs this many usable replies, else the model is "
    "kept.",
    "ExperimentConfig.output_dir": "Where the run writes its files (relative paths: against "
    "`$FEDGO_WORKDIR` if set, else the working directory). Not set (`null`), every run gets a "
    "new folder `outputs/<name>/<date-time>` (`%Y-%m-%d_%H-%M-%S`, then `-1`, `-2` ... if "
    "taken), and `outputs/<name>/latest` links to the newest (a `latest` there that is not a "
    "link is refused, never replaced); the folder chosen is logged. A folder named here that "
    "holds another run's files is refused unless `resume` or `overwrite` is set, and so is a "
    "path with a control character (newline, NUL, ...) or a component over 255 bytes.",
    "ExperimentConfig.device": "The server's device: `auto` (CUDA if present, else MPS, else "
    "the CPU), `cpu`, `cuda`, `cuda:N` or `mps`.",
    "ExperimentConfig.client_device": "The clients' device, the same choices. In a simulation "
    "a client sees a GPU only with `resources.client_gpus > 0`; `cuda` without it is refused.",
    "ExperimentConfig.round_timeout": "Seconds the server waits for a round's replies; a "
    "client that has not replied by then is left out of the round (logged with its id).",
    "ExperimentConfig.checkpoint": "Write `checkpoint.pt` (the server's state) after every "
    "round, and let clients keep their state (SCAFFOLD's c_i) on disk.",
    "ExperimentConfig.resume": "Continue from `output_dir/checkpoint.pt` (or "
    "`checkpoint.prev.pt`) if there is one, or without `output_dir` from the run "
    "`outputs/<name>/latest` names (none yet: a new run); a run that stopped before its first "
    "checkpoint starts again. The configuration must equal the checkpoint's except for "
    "`rounds`, `resume`, `overwrite`, `strict`, `round_timeout`, `faults`, `checkpoint`, "
    "`device`, `client_device`, `resources`, `eval`, `logging`, `name` and `output_dir`; "
    "raising `rounds` extends a finished run. A "
    "checkpoint whose values do not fit the configured run (its model's shapes or dtypes, "
    "non-finite or huge values, a round beyond `rounds`) is refused with one error naming the "
    "file, as is resuming a finished run without raising `rounds` ([running.md](running.md), "
    "*Checkpoints are data, checked on load*).",
    "ExperimentConfig.overwrite": "Replace the earlier run in `output_dir`. Without it (or "
    "`resume`), a folder that holds a run's files (`metrics.jsonl`, `summary.json`, "
    "`model.pt`, checkpoints, FedGO's files) is refused before anything is written.",
    "ExperimentConfig.faults": "Deliberate client failures for tests and demos, e.g. "
    "`[{partition: 1, round: 2, kind: crash}]`. Only nodes that opted in act them out (node "
    "config `allow-faults=true`; simulated nodes: `FEDGO_ALLOW_FAULTS=1`, which `./run.sh` "
    "sets); other nodes ignore them with a WARNING.",
    "FaultConfig.kind": "What the client does (see above).",
    # DataConfig
    "DataConfig.dataset": "`digits` (scikit-learn's, built in), `four_gaussians` (synthetic, "
    "FedGO App. E.1), `cifar10`, `cifar100` (torchvision), `imagefolder` (a local "
    "`train/<class>/*`, `test/<class>/*` tree) or `hf:<id>` (a Hugging Face image dataset: "
    "`pip install -e .[hf]`, needs internet).",
    "DataConfig.path": "The ImageFolder root, or the folder holding torchvision's CIFAR "
    "archives (`cifar-10-batches-py/`, `cifar-100-python/`).",
    "DataConfig.download": "Let torchvision download CIFAR (needs internet); without it a "
    "missing archive stops the run before it starts.",
    "DataConfig.num_clients": "K, the number of clients (partitions).",
    "DataConfig.alpha": "Dirichlet concentration of the `dirichlet` and `dirichlet_prior` "
    "splits (smaller: more skewed).",
    "DataConfig.server_fraction": "Share of each class the server holds (unlabeled for "
    "training; its labels only feed diagnostics). 0: none (FedAvg, FedProx, SCAFFOLD, the "
    "one-shot data-free strategies, FedGO distilling on generated data). FedDF and FedGO on "
    "server data need it; CPFL with more than one cohort needs it or `data.public_path`.",
    "DataConfig.min_client_size": "The split is redrawn until every client holds this many "
    "samples.",
    "DataConfig.augment": "Random horizontal flips during training, where the dataset allows them.",
    "DataConfig.train_subset": "Use a stratified subset of this many training images (fixed, "
    "independent of the seed).",
    "DataConfig.test_subset": "Evaluate on a stratified subset of this many test images "
    "(fixed, independent of the seed).",
    "DataConfig.public_path": "The server's unlabeled images from another data set: a folder "
    "of images (any depth), resized to the training images' size, e.g. STL-10's unlabeled "
    "split for CIFAR-10 clients (FedDF Fig. 5-6, FedGO App. F.3). CPFL and the FedDF family "
    "distil on it, and FedGO trains its G1 generator and server-referenced discriminators on "
    "it; `data.server_fraction` may then be 0. Other strategies refuse it. `null`: the "
    "server's share.",
    "DataConfig.quantity_sigma": "`dirichlet_prior` only: client amounts ~ "
    "LogNormal(log(N/K), sigma) over the client pool of N samples (0: equal amounts; "
    "Co-Boosting uses 0.4, 0.8, 1.2).",
    "ModelConfig.name": "`cnn` (small, CPU-sized), `cnn_bn` (the same with BatchNorm), `mlp`, "
    "`resnet8` (FedDF's CIFAR ResNet-8), `resnet18` (CIFAR variant), `vgg11_bn`, `resnet50`, "
    "`gn_lenet` (GroupNorm LeNet of Hsieh et al. 2020, CPFL's CIFAR-10 model; raw logits), "
    "`cnn5` (Co-Boosting's 5-layer CNN, the authors' `CNNCifar`), `lenet5` (the PyTorch "
    "tutorial's LeNet-5, Co-Boosting's MNIST model), `mobilenetv3_small` and `shufflenetv2` "
    "(Co-Boosting's heterogeneous clients, ImageNet layouts as in the authors' code). A model "
    "that cannot take the dataset's inputs is refused by key when the run starts.",
    "ModelConfig.client_models": "One name per client, or a shorter list repeated over the "
    "partition ids; at most `data.num_clients` names. Strategies that average parameters "
    "refuse names other than `model.name`; `coboosting`, `coboosting_fedgo`, `dense` and "
    "`fadi` take them (their ensemble meets in the logits; the student is `model.name`), and "
    "so do `feddf` and `fedgo` (FedDF Alg. 3: one prototype per architecture, each started "
    "from its own clients' average and distilled towards the ensemble of all clients; the "
    "others report `test_accuracy_<arch>`). Each client is sent its own architecture's "
    "arrays and its reply is checked against them.",
    # TrainConfig, EvalConfig, ResourcesConfig
    "TrainConfig.local_epochs": "Client epochs per round.",
    "TrainConfig.batch_size": "Client batch size.",
    "TrainConfig.optimizer": "The clients' optimiser.",
    "TrainConfig.lr": "The clients' learning rate.",
    "TrainConfig.momentum": "SGD momentum.",
    "TrainConfig.weight_decay": "L2 weight decay of the clients' optimiser.",
    "EvalConfig.batch_size": "Batch of the server's test evaluation (64: the fastest on a CPU; "
    "the results do not depend on it; 512 or more on a GPU).",
    "EvalConfig.every": "Evaluate every N rounds (and in the last).",
    "ResourcesConfig.client_cpus": "CPUs of one simulated ClientApp (also its torch threads; a "
    "SuperNode caps them at its CPU count or its `max-threads`).",
    "ResourcesConfig.client_gpus": "GPU share of one simulated ClientApp (0.25: four clients "
    "per GPU); with 0 Ray hides the GPUs from the clients.",
    "ResourcesConfig.server_cpus": "Torch threads of the ServerApp (distillation, evaluation); "
    "`null`: all cores.",
    # strategy.aggregation
    "AggregationConfig.rule": "How every averaging strategy (FedAvg, FedProx, SCAFFOLD's "
    "model update, the FedDF family's average initialisation) combines the round's client "
    "models: `mean` (n_k-weighted, FedAvg), `median` or `trimmed_mean` (coordinate-wise and "
    "unweighted, Yin et al., ICML 2018; these keep the round's models in memory).",
    "AggregationConfig.trim_fraction": "`trimmed_mean` drops `floor(trim_fraction * m)` of the "
    "`m` replies at each end of every coordinate; it must trim at least one of the clients "
    "sampled per round.",
    "AggregationConfig.clip_norm": "Clip each client's update to this L2 norm before the rule "
    "(Sun et al. 2019); rounds record `clients_clipped`. SCAFFOLD's control variates are not "
    "clipped.",
    "AggregationConfig.upload_bound": "Bounds FedGAN's generator and critic (G3), DaFKD's "
    "generator and discriminator heads, FedTGP's prototypes (each class's; the median one "
    "vote per client), SCAFFOLD's control deltas, each teacher's logit scale (FedDF family: "
    "rescaled to the median; one-shot: left out) and each discriminator's (FedGO, CPFL, "
    "Co-Boosting + FedGO: neutral weight). An upload whose L2 norm exceeds `upload_bound` "
    "times the round's (lower) median is scaled down to it, with a WARNING naming the client.",
    # strategy.name
    "StrategyConfig.name": "The server algorithm: a module of `strategies/` ({strategies}). "
    "Its own parameters sit beside it (`strategy.<key>`, below); parameters of other "
    "strategies are ignored with a warning, so swapping `strategy.name` is a one-line change "
    "(`strict: true` makes them an error).",
    # FedDF family
    "FedDFConfig.weighting": "How the ensemble weighs each client on each sample: a method of "
    "the weighting registry (below; `fedgo` and `domain` need FedGO's discriminators).",
    "FedDFConfig.weight_cap": "No client's share of a sample's ensemble weight above this "
    "(the excess goes to the others in proportion; the weights still sum to 1); it must "
    "satisfy `weight_cap * clients per round >= 1`. It bounds single-sigmoid FedGO, where one "
    "client with huge discriminator logits takes weight 1. Pseudo-labels and ensemble "
    "evaluation use it; the `pl_acc_*` diagnostics do not.",
    "FedDFConfig.init": "Distillation starts from the n_k-weighted average of the round's "
    "client models (`average`) or from the last server model (`previous`).",
    "FedDFConfig.val_fraction": "Labelled share of the server set held out for the `feddf` "
    "distillation protocol's early stopping.",
    "FedDFConfig.distill_size": "Distil on this many of the server's unlabeled images (or of "
    "`data.public_path`'s), drawn once with the seed; `null`: all.",
    "FedDFConfig.ensemble_eval_every": "Test the weighted ensemble of the round's client "
    "models every N rounds and in the last (0: never).",
    "FedDFConfig.diagnostics": "Record the pseudo-label accuracy of every weighting and the "
    "label oracle on the same client models each round (`pl_acc_<weighting>`).",
    "DistillConfig.protocol": "`fedgo`: `epochs` passes with Adam at `lr`, cosine decay across "
    "`decay_rounds` rounds (`lr_decay`); `feddf`: at most `max_steps` steps, validation every "
    "`eval_every`, stop after `patience` steps without improvement, `grad_clip`, the best "
    "student kept.",
    "DistillConfig.epochs": "Passes over the distillation set per round (`fedgo` protocol).",
    "DistillConfig.batch_size": "Distillation batch size.",
    "DistillConfig.lr": "Adam's learning rate.",
    "DistillConfig.lr_decay": "Cosine decay of `lr` across `decay_rounds` rounds (`fedgo`).",
    "DistillConfig.decay_rounds": "The rounds the cosine decay spans (`fedgo`).",
    "DistillConfig.temperature": "Softmax temperature of the teacher ensemble and the student.",
    "DistillConfig.augment": "Random flips of the distillation images, where the data allow.",
    "DistillConfig.max_steps": "Most steps per round (`feddf` protocol).",
    "DistillConfig.eval_every": "Steps between validations (`feddf` protocol).",
    "DistillConfig.patience": "Steps without a better validation before stopping (`feddf`).",
    "DistillConfig.grad_clip": "Gradient norm clip (`feddf` protocol).",
    "DistillConfig.bn_stats": "The student's BatchNorm statistics while it distils: `update` "
    "(train mode), `batch` (train mode, then the averaged model's running statistics are put "
    "back), `eval` (BatchNorm in eval mode: the averaged model's statistics normalise every "
    "batch); `auto`: `batch` on generated data (FedGO D2, DaFKD), `update` on real data. "
    "Generated images' statistics can ruin a server model under `update` "
    "(`fedgo_flwr/learning/distill.py` explains).",
    "FedGOConfig.weighting": "FedGO's odds weights by default.",
    "FedGOConfig.distill_data": "`server` (D1: the server's unlabeled share) or `generated` "
    "(D2: `generated_size` samples of the generator, drawn once). D2 works with "
    "`data.server_fraction: 0` when the generator is loaded, built by `generator.module`, "
    "untrained (`generator.steps: 0`) or trained by FedGAN (G3), with the `fedgo` "
    "distillation protocol.",
    "FedGOConfig.generated_size": "Samples in the generated distillation set (D2).",
    "FedGOConfig.byzantine": "FedGO App. F.8: this many clients (seeded, the same all run, "
    "listed in `prefl.json`) return a discriminator that outputs its maximum everywhere. "
    "Defences: `weighting_params.fedgo.clip`, `weight_cap`.",
    # GAN sections
    "GeneratorConfig.latent_dim": "Size of the generator's normal latent codes.",
    "GeneratorConfig.batch_size": "WGAN-GP batch size.",
    "GeneratorConfig.lr": "Adam's learning rate (generator and critic).",
    "GeneratorConfig.n_critic": "Critic steps per generator step (WGAN-GP).",
    "GeneratorConfig.gp_lambda": "Weight of WGAN-GP's gradient penalty.",
    "DiscriminatorConfig.name": "The discriminator network.",
    "DiscriminatorConfig.batch_size": "Discriminator training batch size.",
    "DiscriminatorConfig.lr": "Adam's learning rate.",
    # CPFL
    "CPFLConfig.cohorts": "Number of cohorts n (1: FedAvg with early stopping; "
    "`data.num_clients`: one-shot FedKD, every client a cohort).",
    "CPFLConfig.grouping": "`random` (seeded, near-equal sizes) or `class` (one cohort per "
    "dominant class; `cohorts` must equal the number of classes).",
    "CPFLConfig.window": "Rounds of the moving average of a cohort's mean validation loss.",
    "CPFLConfig.patience": "A cohort stops once its smoothed validation loss has not reached a "
    "new minimum for this many rounds.",
    "CPFLConfig.teacher": "A cohort's teacher: the model with the lowest smoothed loss "
    "(`best`) or its `last`.",
    "CPFLConfig.distill_when": "Distil once this share of the cohorts has converged (the rest "
    "at their best as of then).",
    "CPFLConfig.distill_at_hours": "Or distil at this simulated time (hours).",
    "CPFLConfig.cohort_eval_every": "Test accuracy of each cohort that trained, every N "
    "rounds (0: only the teachers at the end).",
    "CPFLConfig.teacher_test_size": "Evaluate the teachers and their ensemble on a stratified "
    "subset of this many test images (the student always on all); `null`: all.",
    "CPFLConfig.profiles": "Device profiles: a CSV `client_id,seconds_per_batch,"
    "bytes_per_second`, one row per client; `null`: a seeded synthetic population, "
    "log-uniform over 0.9-11.9 s per mini-batch and 130 KB/s-26 MB/s.",
    "CohortClientConfig.local_algorithm": "The client algorithm every cohort runs (`fedavg`, "
    "`fedprox`; not `scaffold`, whose server state cohorts do not keep).",
    "CohortClientConfig.local_params": "Its parameters, e.g. `{mu: 0.01}`.",
    "CohortClientConfig.val_fraction": "Each client with at least `min_val_samples` samples "
    "keeps this share apart and reports the received model's loss on it.",
    "CohortClientConfig.min_val_samples": "Smallest client that keeps a validation split.",
    "CohortDistillConfig.epochs": "Epochs of the student's distillation.",
    "CohortDistillConfig.steps": (
        "Adam steps of the distillation instead of `epochs` passes (null: `epochs`); the paper's "
        "budget is 9,800 (50 epochs of 100,000 images at batch 512)."
    ),
    "CohortDistillConfig.public_size": (
        "Distil on a seeded random subset of this many public images (null: all of them)."
    ),
    "CohortDistillConfig.batch_size": "Distillation batch size.",
    "CohortDistillConfig.lr": "Adam's learning rate.",
    "CohortDistillConfig.beta1": "Adam's beta1.",
    "CohortDistillConfig.weights": "The teachers' weights `p_ic` in the L1 target "
    "`sum_i p_ic z_ic`: `label` (`N_ic / sum_j N_jc`, the authors' code), `size` (`N_i / N`, "
    "the paper's text), `uniform` (1/n), or `fedgo` (beyond the paper: FedGO's discriminator "
    "odds per sample, a cohort's weight the sum of its clients' `n_k Phi_k(x)`; runs FedGO's "
    "pre-FL stage with `strategy.generator` and `strategy.discriminator`, the generator "
    "trained on the public set).",
    "CohortDistillConfig.disc_mode": "With `weights: fedgo`: how discriminator logits become "
    "odds, as FedGO's `disc_mode`.",
    "CohortDistillConfig.outputs": "Distil `logits` or `log_probs` (log-softmax outputs, the "
    "authors' GN-LeNet).",
    "CohortDistillConfig.teacher_batch_size": "Batch of the teachers' inference.",
    # one-shot
    "CoBoostingConfig.student_init": "The student starts from the server's seeded "
    "initialisation (`fresh`, the paper) or the clients' average (`average`, one architecture "
    "only).",
    "CoBoostingConfig.nz": "Latent size of the DENSE / Co-Boosting generator.",
    "CoBoostingConfig.ngf": "Width of that generator (images with H and W multiples of 4).",
    "SynthesisSettings.batch_size": "Synthetic batch size.",
    "CoBoostingFedGOConfig.combine": "The ensemble weighs client k on sample x by FedGO's odds "
    "weight `n_k Phi_k(x) / sum_i n_i Phi_i(x)` alone (`odds`) or times Co-Boosting's "
    "learned `w_k` (`odds_learned`).",
    "CoBoostingFedGOConfig.disc_mode": "How discriminator logits become odds, as FedGO's "
    "`disc_mode`.",
}
"""Descriptions of keys that have no attribute docstring, by ``Class.field``.

A class's entry serves its subclasses too. The generator refuses an entry that names no field.
"""

INTRO = """\
An experiment is one YAML file. `conf/base.yaml` lists every core key with its default (a test
keeps it equal to the dataclasses below); other files start from it with `base: base.yaml` and
change what differs. Overrides on the command line are `dotted.key=value`, the value parsed as
YAML (`./run.sh conf/fedprox.yaml data.alpha=0.05 strategy.mu=0.001`). A strategy's own keys
sit beside `strategy.name`; their defaults are its `Config` class (`strategies/<name>.py`).

`conf/` has one file per strategy and per paper setting: `conf/paper/<peer>-cifar10-a0.1.yaml`
is each Table-3 peer of the FedGO paper with its App. E.2 values on FedGO's CIFAR-10 setting,
`conf/paper/fedgo-*.yaml` FedGO with the paper's settings (Sec. 4, App. E.2), and
`conf/bench/` the presets of the CPU benchmarks. Paper-scale presets take hours on a GPU
(`benchmarks/paper_cost.py` estimates a preset's cost on the machine at hand).

Validation names the key, the value and where it came from, and stops before anything runs
(`./run.sh` and `prepare` exit with status 2; the ServerApp runs the same checks):

```
fedgo-flwr: invalid configuration: override 'data.alpha=-1': data.alpha = -1.0: must be > 0
```
"""

RULES = """\
## What every key must satisfy

Besides each key's own checks below, the schema (`fedgo_flwr/experiment/schema.py`) and the YAML
reader (`fedgo_flwr/experiment/config.py`) refuse, naming the key; `REFUSED` in
`tests/unit/test_config.py` lists every case:

- **Keys and types.** A key no section has (the error suggests the closest one); a value of
  the wrong type (an `int` is accepted for a `float`).
- **Numbers.** `.inf` and `.nan` in any float key; an integer beyond ±{max_int} unless the
  key states another limit; an integer literal of more than 100 digits. YAML reads `1e-3` as
  text, not a number: write a dot and a signed exponent (`1.0e-3`, `1.0e+6`), as the error
  says.
- **Files.** An empty file (or only comments: it would run the defaults); a key given twice
  in one mapping (YAML would keep the last); a file that is not UTF-8 text; nesting deeper
  than 50 levels; more than 100,000 values once YAML aliases are expanded.
- **Pre-flight** (`preflight` in `fedgo_flwr/app/cli.py`: the machine and the files). The data
  must be there (`imagefolder`'s `train/` folder; CIFAR's torchvision folder under `data.path`
  unless `data.download`); every `path` of the strategy's parameters must be an existing file;
  `device: cuda:N` needs CUDA device N on this machine (`mps`: Apple's MPS); FedDF and FedGO
  on server data need `data.server_fraction > 0`. A strategy adds its own checks of the whole
  experiment in its `check_config` and `preflight` class methods (for example, `weight_cap`
  must be feasible for the clients sampled per round).
"""
