"""How much slower does a job run while pitstop attach samples it?

The planted-loader job (tests/scripts/attach/slow_loader.py) runs once; during its run pitstop's sampler
(``PySpySampler``: py-spy record --nonblocking --idle --subprocesses, what ``pitstop attach`` runs) is
switched on and off in alternating blocks of ``--block`` seconds. Each on-block is compared with the
off-blocks on both sides of it (median whole-step time, batch wait included), so the machine's drifting load
and the job's own warm-up fall on both; the mean of those ratios is the overhead, with its standard error.
(Separate runs with and without attach were tried first: on a shared 2-core machine two identical runs
differ by up to ±40%, far more than the effect.) pitstop's own start-up and report (one Python process, about
2 CPU-seconds, before and after the window) are not in the figure.

    .venv/bin/python bench/attach_overhead.py [--seconds 90] [--block 6] [--rate 100] [--sleep 0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "scripts" / "attach" / "slow_loader.py"


def run(seconds: float, block: float, rate: float, sleep: float, tmp: Path) -> tuple[list, list]:
    """The job's steps (end time, seconds) and the blocks (start, end, sampled)."""
    from pitstop.attach.sampler import PySpySampler

    steps = tmp / "steps.txt"
    cmd = [
        sys.executable,
        str(JOB),
        "--seconds",
        str(seconds),
        "--step-times",
        str(steps),
        "--sleep",
        str(sleep),
    ]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert job.stdout is not None
    for line in job.stdout:
        if line.startswith("ready"):
            break
    time.sleep(2.0)  # past the first steps
    blocks, sampled = [], False
    while job.poll() is None and len(blocks) < 200:
        t0 = time.time()
        if sampled:
            try:
                PySpySampler().sample(job.pid, block, rate)
            except Exception:  # the job ended inside the block
                break
        else:
            time.sleep(block)
        blocks.append((t0, time.time(), sampled))
        sampled = not sampled
    job.communicate()
    if job.returncode != 0:
        raise SystemExit(f"the job exited {job.returncode}")
    rows = [line.split() for line in steps.read_text().splitlines()]
    return [(float(t), float(dt), float(c)) for t, dt, c in rows], blocks


def median_in(steps: list, a: float, b: float, column: int = 1) -> float | None:
    inside = [row[column] for row in steps if a + 0.3 <= row[0] <= b]  # the first 0.3 s: py-spy starting
    return statistics.median(inside) if len(inside) >= 5 else None


def compare(steps: list, blocks: list, column: int, what: str) -> None:
    """Each sampled block against the mean of its two neighbours (not sampled)."""
    medians = [median_in(steps, a, b, column) for a, b, _ in blocks]
    ratios = []
    for i, (_, _, on) in enumerate(blocks):
        if on and 0 < i < len(blocks) - 1:
            before, during, after = medians[i - 1], medians[i], medians[i + 1]
            if before and during and after:
                ratios.append(during / ((before + after) / 2))
    off = [m for m, (_, _, on) in zip(medians, blocks, strict=True) if m and not on]
    on = [m for m, (_, _, s) in zip(medians, blocks, strict=True) if m and s]
    line = f"{what}: not sampled {1000 * statistics.median(off):.2f} ms, sampled {1000 * statistics.median(on):.2f} ms"
    if len(ratios) > 1:
        mean, se = statistics.fmean(ratios), statistics.stdev(ratios) / len(ratios) ** 0.5
        line += (
            f"; sampled / neighbours {100 * (mean - 1):+.2f}% ± {100 * se:.2f}% (s.e., {len(ratios)} blocks)"
        )
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--block", type=float, default=6.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--sleep", type=float, default=0.0, help="the job's sleep per example (0: all compute)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        steps, blocks = run(args.seconds, args.block, args.rate, args.sleep, Path(tmp))
    print(
        f"{len(steps)} steps; blocks of {args.block:g} s, py-spy at {args.rate:g} Hz, sleep {args.sleep:g} s/example"
    )
    compare(steps, blocks, 1, "median step time (wall)")
    compare(steps, blocks, 2, "median step CPU time of the job")


if __name__ == "__main__":
    main()
