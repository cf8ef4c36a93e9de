"""How close ``pitstop plan``'s activation formula comes to a real training step, and how long a plan takes.

For each model preset and setting, the memory the end of the forward pass holds for backward (activations
plus the fp32 logits the loss keeps) is computed twice: by the closed-form formula the planner decides with
(``plan.memory.held_after_forward``), and by running one real Hugging Face training step on fake tensors
under torch's ``MemTracker`` (``plan.simulate``). The ratio formula / simulated is printed per row, with
the median and worst absolute error. Then the wall time of a whole ``pitstop plan`` command (a fresh
interpreter, exact parameter counts on the meta device, with and without the simulation) is measured.

    python bench/plan_accuracy.py             # under a minute on 2 cores
    python bench/plan_accuracy.py --json /tmp/plan_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from pitstop.plan.memory import GIB, Setup, held_after_forward
from pitstop.plan.model_shape import model_info_from_config
from pitstop.plan.params import resolve_model
from pitstop.plan.simulate import simulate_step

CASES = [  # model, micro-batch, sequence, attention, activation checkpointing
    ("smollm2-135m", 8, 1024, "sdpa", False),
    ("qwen2-0.5b", 2, 2048, "sdpa", False),
    ("qwen2-0.5b", 2, 2048, "sdpa", True),
    ("llama-3.2-1b", 1, 4096, "sdpa", False),
    ("llama-3.2-1b", 2, 1024, "eager", False),
    ("gemma-2b", 1, 2048, "sdpa", False),
    ("qwen2.5-3b", 1, 2048, "sdpa", True),
    ("llama-3.1-8b", 1, 4096, "sdpa", False),
    ("llama-3.1-8b", 4, 2048, "sdpa", True),
    ("mistral-7b", 1, 2048, "eager", False),
]


def accuracy() -> list[dict[str, object]]:
    rows = []
    for name, batch, seq, attn, ckpt in CASES:
        config = resolve_model(name)[1]
        s = Setup(model_info_from_config(config), seq=seq, micro_batch=batch, attn=attn, checkpointing=ckpt)
        start = time.perf_counter()
        simulated = simulate_step(config, batch, seq, attn, ckpt).activations
        sim_s = time.perf_counter() - start
        formula = held_after_forward(s)
        rows.append(
            {
                "model": name,
                "micro_batch": batch,
                "seq": seq,
                "attn": attn,
                "checkpointing": ckpt,
                "formula_gib": round(formula / GIB, 3),
                "simulated_gib": round(simulated / GIB, 3),
                "ratio": round(formula / simulated, 4),
                "simulation_s": round(sim_s, 2),
            }
        )
        row = rows[-1]
        print(
            f"{name:14s} b={batch} s={seq:5d} {attn:5s} ckpt={'y' if ckpt else 'n'}  formula "
            f"{row['formula_gib']:8.2f} GiB  simulated {row['simulated_gib']:8.2f} GiB  ×{row['ratio']:.3f}  "
            f"({sim_s:.1f} s)",
            flush=True,
        )
    return rows


def command_seconds(*args: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pitstop", "plan", *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    opts = parser.parse_args()
    rows = accuracy()
    errors = [abs(float(r["ratio"]) - 1) for r in rows]  # type: ignore[arg-type]
    print(f"\nformula vs simulated: median error {statistics.median(errors):.1%}, worst {max(errors):.1%}")
    base = ("--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--seq", "4096")
    timing = {
        "plan_no_simulate_s": round(command_seconds(*base, "--no-simulate"), 2),
        "plan_with_simulate_s": round(command_seconds(*base), 2),
    }
    print(
        f"`pitstop plan {' '.join(base)}`: {timing['plan_no_simulate_s']:.1f} s without the simulation, "
        f"{timing['plan_with_simulate_s']:.1f} s with it (median of 3, fresh interpreter each)"
    )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"rows": rows, "timing": timing}, f, indent=1)


if __name__ == "__main__":
    main()
