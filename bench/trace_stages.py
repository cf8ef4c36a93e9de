"""Where `pitstop analyze`'s CPU goes on one gzipped trace: the reader's stages in process (ISA-L's inflate
alone, then with the boundary scan of each read, then ``read_columns``: the text parser and the event loop),
the whole process, and the whole process on a 66 KB trace (start-up, imports, report), each round paired with
``zcat | wc -c`` on the same file; medians of --repeat rounds. Reuse a trace of bench/trace_speed.py --keep:

    python bench/trace_stages.py /tmp/t26/512/rank0.json.gz
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from trace_speed import HERE, measure

TINY = (
    HERE.parents[1]
    / "shared"
    / "data"
    / "traces"
    / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"
)
STAGE = r"""
import sys, time
from pathlib import Path
from isal import igzip
from pitstop.trace import events
from pitstop.trace._eventloop import scan
stage, path = sys.argv[1], Path(sys.argv[2])
start = time.process_time()
if stage == "read_columns":
    events.read_columns(path)
else:
    buf = bytearray(1 << 20)
    with igzip.open(path, "rb") as f:
        while n := f.readinto(buf):
            if stage == "inflate + scan":
                scan(memoryview(buf)[:n], 0, 0, 0, 512)
print(time.process_time() - start)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = subprocess.run(
        ["bash", "-c", f"zcat {args.trace} | wc -c"], capture_output=True, text=True, check=True
    )
    gib = int(size.stdout) / 2**30
    analyze = ["pitstop", "analyze", "--json", os.devnull, "--no-history"]
    rows: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        rows.setdefault("zcat | wc -c", []).append(measure([f"zcat {args.trace} | wc -c"], shell=True)[1])
        for stage in ("inflate", "inflate + scan", "read_columns"):
            out = subprocess.run(
                [sys.executable, "-c", STAGE, stage, str(args.trace)], capture_output=True, text=True
            )
            rows.setdefault(f"in process: {stage}", []).append(float(out.stdout))
        rows.setdefault("pitstop analyze", []).append(
            measure([*analyze[:2], str(args.trace), *analyze[2:]])[1]
        )
        rows.setdefault("pitstop analyze, 66 KB trace", []).append(
            measure([*analyze[:2], str(TINY), *analyze[2:]])[1]
        )
    print(f"{gib * 1024:.0f} MiB of text")
    for what, cpu in rows.items():
        median = statistics.median(cpu)
        per_gib = "" if "66 KB" in what else f"  {median / gib:6.2f} CPU s/GiB"
        print(f"{what:32} {median:7.2f} CPU s{per_gib}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
