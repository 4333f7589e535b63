"""The integration tier: in-process runs on tiny data, and the benchmark scripts on it.

Every test starts on one torch thread, as a unit test does (``tests/unit/conftest.py``): the
benchmark scripts called here (``main(argv)``) and the tests' own tensor work train and evaluate
tiny models, where a second thread only waits for the first, the more so beside other work on
a 2-core machine. An in-process run still sets its own threads from ``resources.server_cpus``
(the golden runs: all cores, as recorded), and the thread count is restored after each test.
"""

from __future__ import annotations

from helpers import one_torch_thread  # noqa: F401  (autouse: applies to every test here)
