"""One training step of a small MLP under an address-space cap: exit 0 if it ran, 3 if memory ran out."""

from __future__ import annotations

import resource
import sys

import torch

from pitstop.plan.batch_finder import is_out_of_memory

WIDTH, DEPTH, BUDGET = 1024, 4, 80 * 2**20


def main() -> int:
    batch = int(sys.argv[1])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step(rows: int) -> None:
        model(torch.randn(rows * 256, WIDTH)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(1)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + BUDGET, resource.RLIM_INFINITY))
    try:
        step(batch)
    except BaseException as exc:
        if is_out_of_memory(exc):
            return 3
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
