"""The prose of ``docs/configuration.md`` that is not in the configuration dataclasses: the
page's introduction (:data:`INTRO`) and the rules every key obeys (:data:`RULES`). A key's
description is its attribute docstring, in the dataclass that declares it. Read by
:mod:`docs.gen_configuration`, which renders the page.
"""

from __future__ import annotations

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

Besides each key's own checks below, the schema (`fedgo_flwr/config/schema.py`) and the YAML
reader (`fedgo_flwr/config/experiment.py`) refuse, naming the key; `REFUSED` in
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
- **Pre-flight** (`preflight` in `fedgo_app/cli.py`: the machine and the files). The data
  must be there (`imagefolder`'s `train/` folder; CIFAR's torchvision folder under `data.path`
  unless `data.download`); every `path` of the strategy's parameters must be an existing file;
  `device: cuda:N` needs CUDA device N on this machine (`mps`: Apple's MPS); FedDF and FedGO
  on server data need `data.server_fraction > 0`. A strategy adds its own checks of the whole
  experiment in its `check_config` and `preflight` class methods (for example, `weight_cap`
  must be feasible for the clients sampled per round).
"""
