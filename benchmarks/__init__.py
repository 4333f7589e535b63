"""The benchmark drivers: ``python -m benchmarks.<script>`` from the repository's root.

:mod:`benchmarks.sweep` is the drivers' shared module (child-process runs, the methods x seeds
sweep, the kept records and the table cells); each other module is one benchmark, with its own
methods, configs and table layout. Not part of the Flower app (``fab-exclude`` in
``pyproject.toml``) nor of the installed package.
"""
