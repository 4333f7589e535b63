"""What a run writes and what is read back from it: ``recorder`` (metrics.jsonl, summary.json,
model.pt), ``checkpoint`` (per-round checkpoints, resuming), ``runfolders`` (a folder per run),
``runlog`` (run.log), ``provenance`` (env.json, the config fingerprint), ``tracking`` (MLflow,
TensorBoard), ``report`` and ``report_groups`` (tables of finished runs) and ``plots`` (their
figures and the sweep's). Above the library's learning code (the recorder evaluates models).
"""
