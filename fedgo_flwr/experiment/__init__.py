"""An experiment: its configuration, what is built from it and what a run writes.

The configuration layer, the bottom one (standard library and YAML only; nothing else of
``fedgo_flwr`` is imported): ``schema`` (typed sections from mappings), ``names`` (the dataset,
model and partition names a config accepts) and ``config`` (the core sections, YAML files,
overrides). Above it, as library: ``task`` (an experiment's data, partition and models),
``recorder`` (metrics.jsonl, summary.json, model.pt), ``checkpoint`` (per-round checkpoints,
resuming), ``runfolders`` (a folder per run), ``report`` (plots and tables of finished runs)
and ``plots`` (its figures and the sweep's).
"""
