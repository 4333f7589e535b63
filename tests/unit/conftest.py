"""The unit tier: pure functions on tiny tensors, one torch thread each.

A test here trains or evaluates models of a few thousand parameters; a second thread does not
make that faster, and beside other work on the machine it makes it far slower (the threads
wait for each other: ``test_wgan_gp_learns_a_shifted_gaussian`` took 797 s with 2 threads on
a loaded 2-core machine, 45 s with 1). In-process runs (``tests/integration``) set their
threads from ``resources.server_cpus`` as a deployment does.
"""

from __future__ import annotations

from helpers import one_torch_thread  # noqa: F401  (autouse: applies to every test here)
