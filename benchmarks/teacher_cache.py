"""Speed-up of computing teacher logits once per round instead of in every distillation epoch.

Both variants run the FedGO distillation protocol (``epochs`` passes, batch 64, random flips)
with the same batches and flips:

- ``cached``: :class:`fedgo_flwr.learning.distill.TeacherBank` computes the K teachers' logits on
  the distillation set once (for both flip views), then :func:`fedgo_flwr.learning.distill.distill`
  trains;
- ``per-batch``: every distillation batch runs all K teachers on the augmented batch and
  recomputes the weights, as a straightforward implementation would, in every epoch.

The script prints both wall times, the speed-up, and the largest difference between the two
students' parameters (they should agree up to float rounding).

    .venv/bin/python -m benchmarks.teacher_cache [--teachers 8] [--size 5000] [--epochs 5]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.distill import DistillConfig, TeacherBank, distill
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.weighting import WeightingInputs, compute_weights
from fedgo_flwr.weighting import pseudo_labels as targets_of

CPU = torch.device("cpu")


def entropy_weights(logits: torch.Tensor) -> torch.Tensor:
    """(K, ..., N, C) -> (K, ..., N) entropy weights (needs nothing but the logits)."""
    flat = logits.reshape(logits.shape[0], -1, logits.shape[-1])
    w = compute_weights("entropy", WeightingInputs(logits=flat, num_examples=torch.ones(len(flat))))
    return w.reshape(logits.shape[:-1])


def per_batch(student, teachers, data, settings, generator) -> float:
    """The naive loop: teachers and weights recomputed for every batch of every epoch."""
    start = time.perf_counter()
    for t in teachers:
        t.eval()
    student.train()
    opt = torch.optim.Adam(student.parameters(), lr=settings.round_lr(1))
    n = len(data)
    for _ in range(settings.epochs):
        order = torch.randperm(n, generator=generator)
        flips = torch.rand(n, generator=generator) < 0.5
        for s in range(0, n, settings.batch_size):
            idx = order[s : s + settings.batch_size]
            if len(idx) < 2:
                continue
            x, _ = data.to_tensors(idx.numpy())
            f = flips[s : s + settings.batch_size].view(-1, 1, 1, 1)
            x = torch.where(f, x.flip(-1), x)
            with torch.no_grad():
                logits = torch.stack([t(x) for t in teachers])
                target = F.softmax((entropy_weights(logits).unsqueeze(-1) * logits).sum(0), -1)
            loss = F.kl_div(F.log_softmax(student(x), -1), target, reduction="batchmean")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--teachers", type=int, default=8)
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", default="cnn")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = ArrayDataset(
        x=rng.integers(0, 256, size=(args.size, 3, 32, 32), dtype=np.uint8),
        y=np.zeros(args.size, dtype=np.int64),
        num_classes=10,
        flip=True,
    )
    teachers = []
    for k in range(args.teachers):
        torch.manual_seed(100 + k)
        teachers.append(build_model(args.model, (3, 32, 32), 10))
    settings = DistillConfig(epochs=args.epochs, batch_size=64, lr=1e-3, lr_decay=False)
    torch.manual_seed(0)
    init = build_model(args.model, (3, 32, 32), 10).state_dict()

    student_a = build_model(args.model, (3, 32, 32), 10)
    student_a.load_state_dict(init)
    t0 = time.perf_counter()
    bank = TeacherBank(data, augment=True)
    for t in teachers:
        bank.add(t, CPU)
    logits = bank.logits
    targets = targets_of(logits, entropy_weights(logits))
    teacher_s = time.perf_counter() - t0
    distill(
        student_a,
        data,
        targets,
        settings,
        server_round=1,
        rng=torch.Generator().manual_seed(1),
        device=CPU,
    )
    cached_s = time.perf_counter() - t0

    student_b = build_model(args.model, (3, 32, 32), 10)
    student_b.load_state_dict(init)
    naive_s = per_batch(student_b, teachers, data, settings, torch.Generator().manual_seed(1))

    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(student_a.parameters(), student_b.parameters(), strict=True)
    )
    print(
        json.dumps(
            {
                "teachers": args.teachers,
                "distill_set": args.size,
                "epochs": args.epochs,
                "threads": torch.get_num_threads(),
                "cached_total_s": round(cached_s, 2),
                "cached_teacher_s": round(teacher_s, 2),
                "per_batch_total_s": round(naive_s, 2),
                "speedup": round(naive_s / cached_s, 2),
                "max_param_difference": diff,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
