"""The benchmarks: ``python -m benchmarks list | run NAME | table NAME`` from the repository's root.

The variants x seeds benchmarks are specs (:mod:`benchmarks.spec`; the registry is
:mod:`benchmarks.__main__`): a config, its methods and their overrides, default seeds, how a
run starts, a table function and a results folder. The other scripts run as ``python -m
benchmarks.<script>``. :mod:`benchmarks.sweep` is the shared module (runs on the child-run
engine, the kept records and the table cells). Not part of the Flower app (``fab-exclude`` in
``pyproject.toml``) nor of the installed package.
"""
