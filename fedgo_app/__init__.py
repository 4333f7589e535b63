"""The apps: the Flower ServerApp and ClientApp, the in-process runner and ``run.sh``'s helpers.

The only layer that imports ``strategies/`` and ``clients/`` (by name, through
:mod:`fedgo_flwr.runtime.plugins`). ``server_app``, ``client_app``, ``inprocess`` and ``cli``
are the entry points; ``discovery`` is their node discovery (which node serves which partition).
"""
