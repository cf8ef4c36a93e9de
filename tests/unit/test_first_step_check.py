"""A trial's check runs once, at the job's first optimizer step, whatever optimizer and however many steps."""

from __future__ import annotations

import torch

from pitstop.remedies.base import at_first_optimizer_step


def test_the_check_runs_once_before_the_first_step() -> None:
    seen: list[float] = []
    weight = torch.nn.Parameter(torch.ones(1))
    handle = at_first_optimizer_step(lambda: seen.append(float(weight.detach())))
    try:
        for opt in (torch.optim.SGD([weight], lr=0.5), torch.optim.Adam([weight], lr=0.5)):
            for _ in range(3):
                weight.grad = torch.ones(1)
                opt.step()
    finally:
        handle.remove()
    assert seen == [1.0]  # once, before the first update changed the weight
