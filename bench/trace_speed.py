"""`pitstop analyze` on one trace against the floor (`zcat | wc -c`: reading and decompressing the bytes)
and Holistic Trace Analysis: wall time, CPU time, peak memory and GiB/s of trace text, over gzipped traces
grown from a real one (bench/make_trace.py), each in two layouts: Kineto's (one event per line) and one line
(the same text without newlines, as a script that re-saves a trace writes it). Each round times zcat and
pitstop on both layouts back to back, so CPU/zcat and CPU/kineto are medians of ratios paired in one round.

    python bench/trace_speed.py --sizes 100 512 1024 2048

HTA runs in its own environment (it pins pandas and friends); without --hta-python it is left out:

    python -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis
    python bench/trace_speed.py --hta-python /tmp/hta/bin/python --sizes 100 512 1024 2048 --hta-max-mib 512

--python-loop also times pitstop with its Python event loop (PITSTOP_TRACE_LOOP=python), the baseline of the C
loop, alternating with the default run.

--before-src DIR also times the pitstop whose sources are in DIR (a worktree of an earlier commit:
`git worktree add /tmp/before COMMIT`, then --before-src /tmp/before/src), alternating with the others.

--keep DIR keeps the generated traces there and reuses them on the next run (generating 2 GiB takes minutes).
CPU time (user + sys of the whole process) is the figure to compare on a shared machine; wall time is noisy.

Each size is timed --repeat times per tool, alternating the tools; medians are reported. Peak memory is the
process's own high-water mark (VmHWM; getrusage after vfork + exec also counts the parent's pages).
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
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE.parents[1] / "shared" / "data" / "traces" / "hta__trace_diff__control__control.json.gz"
HTA_SCRIPT = (
    "import sys\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "a = TraceAnalysis(trace_dir=sys.argv[1])\n"
    "print(a.get_temporal_breakdown(visualize=False).to_json())\n"
)


_HWM = (
    "import atexit, re, sys\n"
    "def hwm(out=sys.argv[1]):\n"
    "    open(out, 'w').write(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    "atexit.register(hwm)\n"
    "sys.argv = sys.argv[2:]\n"
)
PITSTOP = _HWM + "from pitstop.cli.app import main\nmain()\n"


def measure(
    command: list[str], shell: bool = False, env: dict[str, str] | None = None
) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak resident MiB) of one whole process (and its waited-for children)."""
    hwm = Path(tempfile.mktemp(prefix="pitstop-hwm-"))
    if command[:2] == ["pitstop", "analyze"]:
        command = [sys.executable, "-c", PITSTOP, str(hwm), *command]
    start = time.perf_counter()
    proc = subprocess.Popen(
        command if not shell else ["bash", "-c", command[0]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace")[-800:] if proc.stderr else ""
        raise RuntimeError(f"{command[0]} failed ({proc.returncode}): {err}")
    peak = int(hwm.read_text()) / 1024 if hwm.exists() else usage.ru_maxrss / 1024.0
    hwm.unlink(missing_ok=True)
    return wall, usage.ru_utime + usage.ru_stime, peak


def _trace(source: Path, folder: Path, size: float) -> tuple[Path, float]:
    """A gzipped trace of ``size`` MiB of text in ``folder`` (reused when there), and its GiB of text."""
    trace = folder / "rank0.json.gz"
    text_size = folder.with_name(folder.name + ".bytes")  # beside the folder: HTA reads every file in it
    if trace.exists() and text_size.exists():
        return trace, int(text_size.read_text()) / 2**30
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / "rank0.json"
    command = [sys.executable, str(HERE / "make_trace.py"), str(source), str(plain), "--mb", str(size)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    text_size.write_text(str(plain.stat().st_size))
    subprocess.run(["gzip", "-1", "-f", str(plain)], check=True)  # level hardly changes inflate speed
    return trace, int(text_size.read_text()) / 2**30


LAYOUTS = ("kineto", "one_line")


def _layout(trace: Path, layout: str) -> tuple[Path, float]:
    """The trace in ``layout`` and its GiB of text: as grown (Kineto's, one event per line), or one line: every
    newline removed, which leaves valid JSON (a raw newline never occurs inside a JSON string) with the same
    events and numbers, as a script that re-saves a trace without indent writes it."""
    out = trace if layout == "kineto" else trace.with_name(f"{layout}.json.gz")
    if not out.exists():
        command = f"zcat {trace} | tr -d '\\n' | gzip -1 > {out}"
        subprocess.run(["bash", "-c", "set -o pipefail; " + command], check=True)
    size = subprocess.run(["bash", "-c", f"zcat {out} | wc -c"], check=True, capture_output=True, text=True)
    return out, int(size.stdout) / 2**30


Times = dict[str, list[tuple[float, float, float]]]


def _time_layouts(traces: dict[str, Path], args: argparse.Namespace, hta: str | None) -> dict[str, Times]:
    """Every tool on every layout, --repeat rounds, alternating, so each round's figures are paired."""
    runs: dict[str, Times] = {layout: {} for layout in traces}
    for _ in range(args.repeat):
        for layout, trace in traces.items():
            times = runs[layout]
            analyze = ["pitstop", "analyze", str(trace), "--json", os.devnull, "--no-history"]
            times.setdefault("floor", []).append(measure([f"zcat {trace} | wc -c"], shell=True))
            times.setdefault("ours", []).append(measure(analyze))
            if args.python_loop:
                env = {**os.environ, "PITSTOP_TRACE_LOOP": "python"}
                times.setdefault("python_loop", []).append(measure(analyze, env=env))
            if args.before_src:
                env = {**os.environ, "PYTHONPATH": str(args.before_src)}
                times.setdefault("before", []).append(measure(analyze, env=env))
            if hta and layout == "kineto":
                times.setdefault("hta", []).append(measure([hta, "-c", HTA_SCRIPT, str(trace.parent)]))
    return runs


def _paired(ours: list[tuple[float, float, float]], base: list[tuple[float, float, float]]) -> float:
    """The median of the per-round ratios of CPU time (both measured in the same round)."""
    return statistics.median(o[1] / b[1] for o, b in zip(ours, base, strict=True))


def _row(times: Times, layout: str, trace: Path, text_gib: float, runs: dict[str, Times]) -> dict[str, Any]:
    ours, floor = times["ours"], times["floor"]
    row: dict[str, Any] = {
        "layout": layout,
        "text_mib": round(text_gib * 1024),
        "gz_mib": round(trace.stat().st_size / 2**20),
        "pitstop_s": statistics.median(w for w, _, _ in ours),
        "pitstop_cpu_s": statistics.median(c for _, c, _ in ours),
        "pitstop_peak_mib": max(m for _, _, m in ours),
        "floor_s": statistics.median(w for w, _, _ in floor),
        "floor_cpu_s": statistics.median(c for _, c, _ in floor),
        # the least CPU of the runs: the best estimate of the cost where neighbours take nothing
        "pitstop_cpu_min_s": min(c for _, c, _ in ours),
        "floor_cpu_min_s": min(c for _, c, _ in floor),
        "cpu_vs_zcat": _paired(ours, floor),  # the 1.5x bound
        "cpu_vs_kineto": _paired(ours, runs["kineto"]["ours"]) if "kineto" in runs else None,
    }
    if "python_loop" in times:
        row["python_loop_cpu_s"] = statistics.median(c for _, c, _ in times["python_loop"])
        row["python_loop_cpu_s_per_gib"] = row["python_loop_cpu_s"] / text_gib
        row["python_loop_cpu_min_s"] = min(c for _, c, _ in times["python_loop"])
    if "before" in times:
        row["before_cpu_s"] = statistics.median(c for _, c, _ in times["before"])
        row["before_cpu_min_s"] = min(c for _, c, _ in times["before"])
        row["before_peak_mib"] = max(m for _, _, m in times["before"])
    row["gib_per_s"] = text_gib / row["pitstop_s"]
    row["gib_per_cpu_s"] = text_gib / row["pitstop_cpu_s"]
    row["cpu_s_per_gib"] = row["pitstop_cpu_s"] / text_gib
    if "hta" in times:
        row["hta_s"] = statistics.median(w for w, _, _ in times["hta"])
        row["hta_mib"] = max(m for _, _, m in times["hta"])
    return row


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'layout':>8} {'text MiB':>8} {'wall s':>7} {'CPU s':>6} {'CPU s/GiB':>9} {'peak MiB':>8} "
        f"{'zcat CPU':>8} {'CPU/zcat':>8} {'CPU/kineto':>10} {'HTA s':>7} {'py loop CPU s/GiB':>17}"
    )
    for r in rows:
        versus = r["cpu_vs_kineto"]
        print(
            f"{r['layout']:>8} {r['text_mib']:8.0f} {r['pitstop_s']:7.1f} {r['pitstop_cpu_s']:6.1f} "
            f"{r['cpu_s_per_gib']:9.2f} {r['pitstop_peak_mib']:8.0f} {r['floor_cpu_s']:8.1f} "
            f"{r['cpu_vs_zcat']:8.2f} "
            + (f"{versus:10.2f}" if versus is not None else f"{'-':>10}")
            + (f" {r['hta_s']:7.1f}" if "hta_s" in r else f" {'-':>7}")
            + (f" {r['python_loop_cpu_s_per_gib']:17.2f}" if "python_loop_cpu_s" in r else f" {'-':>17}")
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--sizes", type=float, nargs="+", default=[100, 512, 1024, 2048], help="MiB of text")
    parser.add_argument("--hta-python", default=None, help="a Python with holistictraceanalysis installed")
    parser.add_argument("--hta-max-mib", type=float, default=None, help="run HTA only up to this size")
    parser.add_argument("--keep", type=Path, default=None, help="keep / reuse the generated traces here")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS), help="trace text layouts"
    )
    parser.add_argument(
        "--python-loop",
        action="store_true",
        help="also time pitstop with the Python event loop (the baseline)",
    )
    parser.add_argument(
        "--before-src",
        type=Path,
        default=None,
        help="also time the pitstop in this src folder (e.g. a worktree)",
    )
    args = parser.parse_args()
    if not args.source.exists():
        print(f"no source trace at {args.source} (../shared/data is needed)", file=sys.stderr)
        return 2
    rows = []
    work = args.keep or Path(tempfile.mkdtemp(prefix="pitstop-bench-"))
    try:
        for size in args.sizes:
            trace, _ = _trace(args.source, work / f"{int(size)}", size)
            made = {layout: _layout(trace, layout) for layout in args.layouts}
            traces = {layout: path for layout, (path, _) in made.items()}
            hta = args.hta_python if args.hta_max_mib is None or size <= args.hta_max_mib else None
            runs = _time_layouts(traces, args, hta)
            for layout, times in runs.items():
                row = _row(times, layout, traces[layout], made[layout][1], runs)
                rows.append(row)
                print(json.dumps(row), flush=True)
            if not args.keep:
                for path in traces.values():
                    path.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if not args.hta_python:
        print("HTA: not measured (no --hta-python)")
    _print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
