"""`pitstop analyze` against Holistic Trace Analysis on the same traces: wall time and peak memory of the
whole process each, as ratios, over traces grown from a real one (bench/make_trace.py) up to 1 GiB.

HTA runs in its own environment (it pins pandas and friends):

    python -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis
    python bench/trace_speed.py --hta-python /tmp/hta/bin/python --sizes 128 256 512 1024

Each size is timed --repeat times per tool, alternating the tools; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE.parents[1] / "shared" / "data" / "traces" / "hta__trace_diff__control__control.json.gz"
HTA_SCRIPT = (
    "import sys\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "a = TraceAnalysis(trace_dir=sys.argv[1])\n"
    "print(a.get_temporal_breakdown(visualize=False).to_json())\n"
)


def measure(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of one whole process."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace")[-800:] if proc.stderr else ""
        raise RuntimeError(f"{command[0]} failed ({proc.returncode}): {err}")
    return wall, usage.ru_maxrss / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--sizes", type=float, nargs="+", default=[128, 256, 512, 1024], help="MiB")
    parser.add_argument("--hta-python", default=None, help="a Python with holistictraceanalysis installed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not args.source.exists():
        print(f"no source trace at {args.source} (../shared/data is needed)", file=sys.stderr)
        return 2
    pitstop = shutil.which("pitstop") or str(Path(sys.executable).with_name("pitstop"))
    rows = []
    work = Path(tempfile.mkdtemp(prefix="pitstop-bench-"))
    try:
        for size in args.sizes:
            folder = work / f"{int(size)}"
            folder.mkdir()
            trace = folder / "rank0.json"
            subprocess.run(
                [
                    sys.executable,
                    str(HERE / "make_trace.py"),
                    str(args.source),
                    str(trace),
                    "--mb",
                    str(size),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            actual = trace.stat().st_size / 2**20
            ours: list[tuple[float, float]] = []
            theirs: list[tuple[float, float]] = []
            for _ in range(args.repeat):
                ours.append(measure([pitstop, "analyze", str(trace), "--json", os.devnull]))
                if args.hta_python:
                    theirs.append(measure([args.hta_python, "-c", HTA_SCRIPT, str(folder)]))
            row = {
                "mib": round(actual),
                "pitstop_s": statistics.median(w for w, _ in ours),
                "pitstop_mib": max(m for _, m in ours),
            }
            if theirs:
                row.update(hta_s=statistics.median(w for w, _ in theirs), hta_mib=max(m for _, m in theirs))
                row.update(
                    speedup=row["hta_s"] / row["pitstop_s"], memory_ratio=row["hta_mib"] / row["pitstop_mib"]
                )
            rows.append(row)
            trace.unlink()
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{'trace MiB':>9} {'pitstop s':>10} {'s/GiB':>7} {'peak MiB':>9} {'HTA s':>8} {'peak MiB':>9} "
        f"{'faster':>7} {'memory':>7}"
    )
    for r in rows:
        hta = (
            f"{r['hta_s']:8.1f} {r['hta_mib']:9.0f} {r['speedup']:6.1f}x {r['memory_ratio']:6.1f}x"
            if "hta_s" in r
            else f"{'-':>8} {'-':>9} {'-':>7} {'-':>7}"
        )
        print(
            f"{r['mib']:9d} {r['pitstop_s']:10.1f} {r['pitstop_s'] / r['mib'] * 1024:7.1f} "
            f"{r['pitstop_mib']:9.0f} {hta}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
