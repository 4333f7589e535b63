"""How the code runs: messages between server and clients, devices, threads, seeds and files.

``messages`` (record keys, ArrayRecord <-> NumPy, reply streaming), ``plugins`` (algorithms
found by module name), ``trust`` (which code a client node may import), ``shutdown`` (nothing
recorded once a stop has begun), ``kernels`` (the channels-last memory format, placing models on
a device), ``profiling`` (compute-phase counters), ``rng`` (seeded generators) and ``fileio``
(atomic file writes).
"""
