"""The third-party messages a run filters out (:mod:`fedgo_app.noise`): each filter
drops its one message and nothing beside it."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

from fedgo_app import noise

ROOT = Path(__file__).resolve().parents[2]


def _ray_warning(message: str, category: type[Warning], module: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noise.quiet_known_noise()
        warnings.warn_explicit(message, category, "worker.py", 2051, module=module)
    return [str(w.message) for w in caught]


def test_rays_accelerator_tip_is_filtered_and_nothing_beside_it():
    tip = (
        "Tip: In future versions of Ray, Ray will no longer override accelerator visible "
        "devices env var if num_gpus=0 or num_gpus=None (default). To enable this behavior and "
        "turn off this error message, set RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0"
    )
    assert _ray_warning(tip, FutureWarning, "ray._private.worker") == []
    other = "Pydantic v1 is deprecated and will no longer be supported in Ray 2.56."
    assert _ray_warning(other, FutureWarning, "ray._private.worker") == [other]
    assert _ray_warning(tip, UserWarning, "ray._private.worker") == [tip]
    assert _ray_warning(tip, FutureWarning, "fedgo_flwr.x") == [tip]


def test_flowers_actor_shutdown_line_is_filtered_and_nothing_beside_it():
    logger = logging.getLogger(noise.FLOWER_LOGGER)
    noise.quiet_known_noise()
    noise.quiet_known_noise()  # installed once
    assert logger.filters.count(noise._actor_termination) == 1

    def kept(msg: str, *args: object) -> bool:
        record = logger.makeRecord(logger.name, logging.WARNING, "x.py", 1, msg, args, None)
        return logger.filter(record)

    assert not kept("Manually terminating %s", "ClientAppActor")
    assert kept("Manually terminating %s", "SomethingElse")
    assert kept("Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.")


def test_the_filtered_texts_are_the_installed_packages_own():
    """Each filter matches what the pinned Flower and Ray say (a new version that words it
    otherwise fails here rather than showing the noise again unnoticed); run.sh drops
    Flower's SuperNodes notice from ``flwr run``'s output."""
    import flwr
    import ray

    flwr_dir, ray_dir = Path(flwr.__file__).parent, Path(ray.__file__).parent
    assert noise.FLOWER_SUPERNODES_NOTICE in (flwr_dir / "simulation" / "app.py").read_text()
    worker = (ray_dir / "_private" / "worker.py").read_text()
    assert noise.RAY_ACCELERATOR_TIP in re.sub(r'"\s*\n\s*"', "", worker)  # literals joined
    actor = (flwr_dir / "simulation" / "ray_transport" / "ray_actor.py").read_text()
    assert f'"{noise.ACTOR_TERMINATION}"' in actor
    assert (
        f'grep --line-buffered -vF "{noise.FLOWER_SUPERNODES_NOTICE}"'
        in (ROOT / "run.sh").read_text()
    )
