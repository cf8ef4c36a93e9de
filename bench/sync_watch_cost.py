"""What the host-sync watch costs per call that it wraps but that does not sync (CPU tensors, dtype casts).

    python bench/sync_watch_cost.py

On a GPU run every ``bool(t)``, ``float(t)``, ``.item()``, ``.to()`` goes through a Python wrapper that
passes CPU tensors and non-copying calls straight on; this prints the added time per call. (The sync
debug mode torch provides costs nothing on calls that do not sync: it is a flag read at each sync.)
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pitstop.probe.hooks import Hooks


class _Quiet:
    def guard(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def per_call(fn: Any, n: int = 200_000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    t = torch.ones(())
    calls = {"bool(t)": lambda: bool(t), "t.item()": t.item, "t.to(float64)": lambda: t.to(torch.float64)}
    plain = {name: per_call(fn) for name, fn in calls.items()}
    hooks = Hooks(_Quiet())  # type: ignore[arg-type]
    hooks.install()
    hooks.install_sync_watch()  # on a CPU build torch's sync debug mode is unavailable: wrappers only
    try:
        watched = {name: per_call(fn) for name, fn in calls.items()}
    finally:
        hooks.remove()
    for name in calls:
        added = (watched[name] - plain[name]) * 1e6
        print(
            f"{name:14} {plain[name] * 1e6:6.2f} µs plain, {watched[name] * 1e6:6.2f} µs watched: {added:+.2f} µs"
        )


if __name__ == "__main__":
    main()
