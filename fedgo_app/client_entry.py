"""The ClientApp that Flower loads (``pyproject.toml``'s ``clientapp``): a front that imports
the handlers, :mod:`fedgo_app.client_app`, on its first message.

Why a front: a Flower simulation loads the ClientApp in its own process, to test it, before it
starts Ray (``flwr.server.superlink.fleet.vce.vce_api.start_vce``), while the ServerApp's thread
imports the ServerApp beside it. Importing the handlers there (torch, every client algorithm)
held Ray's start back; with this front Ray's boot, which mostly waits between its processes,
overlaps the ServerApp's imports. Each Ray worker imports the handlers when it answers its first
message (node discovery's query), as before, so nothing moves into round 1. ``--local`` and a
deployment's SuperNode run the same handlers. Measured in ``benchmarks/studies/startup.md``
("The ClientApp's front").

Also here, because this module is what a simulation imports before Ray starts: Ray's prestarted
workers are turned off (``RAY_enable_worker_prestart``, ``RAY_prestart_worker_first_driver``,
unless the environment sets them). Flower starts its actors with a runtime environment of its
own, so the generic workers Ray prestarts for the first driver are never used: they only take
CPU while the rest of the start-up waits for the same cores.
"""

from __future__ import annotations

import os

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedgo_app.noise import quiet_known_noise

RAY_NO_PRESTART = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
"""Ray's switches for the workers it would start before any task asks for one."""


class DeferredClientApp(ClientApp):
    """A ClientApp that hands every message to :data:`fedgo_app.client_app.app`, imported on the
    first message (its mods and handlers, unchanged). An import error of the handlers becomes
    that message's error reply, which names it (node discovery reports it as one line)."""

    def __call__(self, message: Message, context: Context) -> Message:
        from fedgo_app.client_app import app as handlers

        return handlers(message, context)


app = DeferredClientApp()
quiet_known_noise()  # before Ray starts (fedgo_app.noise)
for _key, _value in RAY_NO_PRESTART.items():
    os.environ.setdefault(_key, _value)
