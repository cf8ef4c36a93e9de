"""`pitstop analyze` on folders of rank traces: wall time, CPU time and whether the planted straggler is found,
with --jobs 1, 2, ... and --dask local, over folders made from a real trace (bench/make_trace.py --ranks).

    python bench/fleet_speed.py --ranks 8 64 256 --jobs 1 2 --dask

Each configuration runs --repeat times; medians are reported. CPU time is the process and the workers it
waited for (user + system): on a machine shared with other work it says what the analysis cost even when
the wall time says mostly how busy the machine was.
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
DEFAULT_SOURCE = HERE.parents[1] / "shared" / "data" / "traces" / "hta__nccl_parser_config__nccl_data.json.gz"


def measure(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its waited-for children)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        err = proc.stderr.read().decode(errors="replace")[-800:] if proc.stderr else ""
        raise RuntimeError(f"{' '.join(command)} failed ({code}): {err}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dask", action="store_true", help="also --dask local (with the largest --jobs)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not args.source.exists():
        print(f"no source trace at {args.source} (../shared/data is needed)", file=sys.stderr)
        return 2
    pitstop = [sys.executable, "-m", "pitstop"]
    rows = []
    work = Path(tempfile.mkdtemp(prefix="pitstop-fleet-"))
    try:
        for ranks in args.ranks:
            folder = work / f"ranks{ranks}"
            straggler = ranks // 3
            subprocess.run(
                [
                    sys.executable,
                    str(HERE / "make_trace.py"),
                    str(args.source),
                    str(folder),
                    "--ranks",
                    str(ranks),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            gz_mib = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            configs = [(f"--jobs {j}", ["--jobs", str(j)]) for j in args.jobs]
            if args.dask:
                configs.append(
                    (
                        f"--dask local --jobs {max(args.jobs)}",
                        ["--dask", "local", "--jobs", str(max(args.jobs))],
                    )
                )
            for label, extra in configs:
                out = work / "out.json"
                runs = [
                    measure([*pitstop, "analyze", str(folder), "--json", str(out), "--no-history", *extra])
                    for _ in range(args.repeat)
                ]
                doc = json.loads(out.read_text())
                found = next((f for f in doc["findings"] if f["cause"] == "straggler"), None)
                row = {
                    "ranks": ranks,
                    "gz_mib": round(gz_mib),
                    "config": label,
                    "wall_s": statistics.median(w for w, _ in runs),
                    "cpu_s": statistics.median(c for _, c in runs),
                    "straggler_found": bool(found and found["evidence"].get("slow_rank") == straggler),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'ranks':>5} {'gz MiB':>7} {'config':<24} {'wall s':>7} {'CPU s':>7} {'traces/s':>8} straggler")
    for r in rows:
        print(
            f"{r['ranks']:5d} {r['gz_mib']:7d} {r['config']:<24} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} "
            f"{r['ranks'] / r['wall_s']:8.1f} {'found' if r['straggler_found'] else 'MISSED'}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
