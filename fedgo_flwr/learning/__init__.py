"""The algorithms' shared math (plain NumPy/PyTorch, no Flower): ``training`` (local training and
evaluation), ``aggregation`` (weighted averages, reply array checks), ``distill`` (server
distillation), ``cohorts`` (CPFL's cohorts, stopping rule and L1 distillation) and ``systems``
(simulated device time, CPU-hours and bytes). The packages ``weighting/``, ``datafree/`` and
``gan/`` beside this one hold the rest of it."""
