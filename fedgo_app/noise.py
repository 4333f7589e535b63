"""Third-party messages that say nothing true about a fedgo-flwr run, filtered narrowly.

Each filter matches one message of one package (its text and its warning category or logger),
never a whole category or logger, so any other warning still shows. :func:`quiet_known_noise`
installs them; the ServerApp and the ClientApp modules call it when they are imported, which
in a Flower simulation is before Ray starts (Flower loads the ClientApp, to test it, before it
creates its Ray backend).

- Ray's ``FutureWarning`` "Tip: In future versions of Ray, Ray will no longer override
  accelerator visible devices env var if num_gpus=0 ..." (``ray._private.worker``, on every
  ``ray.init``): a note about a future Ray. Ray today hides the GPUs from a client given none,
  which the configuration relies on (``resources.client_gpus``); the variable the tip names
  (``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0``) would change that, so it is not set.
- Flower's WARNING "Manually terminating ClientAppActor" (``flwr``'s logger, once per Ray actor
  at the end of every simulation): the normal shutdown of the simulation's workers.

Flower's "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2." is logged by the
simulation before any app code loads; ``run.sh``, which always sets the number of simulated
nodes, drops that line from what ``flwr run`` prints (:data:`FLOWER_SUPERNODES_NOTICE`).
"""

from __future__ import annotations

import logging
import warnings

__all__ = [
    "FLOWER_SUPERNODES_NOTICE",
    "RAY_ACCELERATOR_TIP",
    "ACTOR_TERMINATION",
    "quiet_known_noise",
]

RAY_ACCELERATOR_TIP = (
    "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices"
)
"""The start of Ray's FutureWarning (``ray._private.worker``) filtered out."""

ACTOR_TERMINATION = "Manually terminating %s"
"""The format of Flower's shutdown WARNING of a Ray actor (``flwr.simulation.ray_transport``)."""

FLOWER_SUPERNODES_NOTICE = "default simulated SuperNodes changed from 10 to 2"
"""Flower's notice that ``run.sh`` drops from ``flwr run``'s output (it always sets the size)."""

FLOWER_LOGGER = "flwr"


class _ActorTermination(logging.Filter):
    """Drops Flower's "Manually terminating ClientAppActor" record, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == ACTOR_TERMINATION and record.args == ("ClientAppActor",))


_actor_termination = _ActorTermination()


def quiet_known_noise() -> None:
    """Install the filters of this module's docstring (idempotent: each once)."""
    warnings.filterwarnings(
        "ignore",
        message=RAY_ACCELERATOR_TIP,  # a regular expression matched at the message's start
        category=FutureWarning,
        module=r"ray\._private\.worker",
    )
    logging.getLogger(FLOWER_LOGGER).addFilter(_actor_termination)  # the same object: once
