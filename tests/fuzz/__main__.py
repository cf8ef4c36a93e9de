"""The long run on demand: ``python -m tests.fuzz --cases 5000 [--seed S] [--cli 100]``.

Prints the figures (cases run, outcomes, worst time, worst peak RSS) and every failing case with the command
that repeats it; exits 1 when a case failed outside the trace reader (trace failures are listed apart).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.fuzz.harness import make_case, run, run_cli, seeds, summarize, worker_main


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
    parser.add_argument("--cases", type=int, default=2000, help="in-process cases")
    parser.add_argument("--cli", type=int, default=50, help="cases through the real CLI, after those")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="only seeds up to 256 KiB (the CI run)")
    parser.add_argument("--only", type=int, help="repeat one in-process case")
    parser.add_argument("--cli-only", type=int, help="repeat one CLI case")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        worker_main(a.cases, a.seed, a.quick, a.only, a.out)
        return 0
    if a.cli_only is not None:
        outcome = run_cli(make_case(a.cli_only, a.seed, seeds(a.quick), a.quick))
        summary = summarize([], [outcome])
    else:
        summary = run(a.cases, a.seed, a.quick, a.cli, a.only)
    print("\n".join(summary.lines()))
    if summary.failures or summary.trace_failures:
        repeat = "--cli-only" if a.cli_only is not None else "--only"
        print(
            f"repeat one case: python -m tests.fuzz --seed {a.seed}{' --quick' if a.quick else ''} {repeat} INDEX"
        )
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
