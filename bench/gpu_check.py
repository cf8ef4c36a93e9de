"""Confirm the GPU paths on a real GPU (issue 19 items 1-8, issue 30 item 5): run tests/gpu, print one
pass/fail table.

    python bench/gpu_check.py            # `make gpu-check`
    python bench/gpu_check.py activity   # only the checks whose names match (pytest's -k): `make gpu-check ONLY=activity`

Without a CUDA device it prints "skipped: no CUDA GPU" and exits 0. With one it runs the tests in tests/gpu
(among them tests/gpu/test_gpu_activity.py: GPM's SM, tensor and DRAM activity and the energy counter over
one window of a small training, and SM activity against the kernel-busy share of a profiler trace of the
same window; tests/gpu/test_attention_timing_gpu.py: eager against fused attention as ``slow_attention``
times it), prints each check with its outcome and the figures it measured, and exits with pytest's status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cuda_device() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return f"{torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}, torch {torch.__version__}"


def outcomes(junit: Path) -> list[tuple[str, str, str]]:
    """(test name, passed / FAILED / skipped, why) from pytest's JUnit XML."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        status, why = "passed", ""
        for tag, label in (("failure", "FAILED"), ("error", "FAILED"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                message = (found.get("message") or "").strip()
                status, why = label, message.splitlines()[0][:100] if message else ""
                break
        rows.append((case.get("name", "?"), status, why))
    return rows


def table(rows: list[tuple[str, str, str]], measured: dict[str, dict[str, object]]) -> list[str]:
    """The printed table: each check, its outcome, and its figures (else why it failed or was skipped)."""
    width = max((len(name) for name, _, _ in rows), default=10)
    lines = [f"{'check':<{width}}  {'result':<7}  measured"]
    for name, status, why in rows:
        figs = measured.get(name, {})
        text = ", ".join(f"{k}={v}" for k, v in figs.items()) or why
        if figs and why and status != "passed":
            text += f" ({why})"
        lines.append(f"{name:<{width}}  {status:<7}  {text}")
    return lines


def main(argv: list[str] | None = None) -> int:
    only = " ".join(sys.argv[1:] if argv is None else argv).strip()
    device = cuda_device()
    if device is None:
        print("skipped: no CUDA GPU")
        return 0
    print(f"gpu-check on {device}" + (f" (only: {only})" if only else ""))
    with tempfile.TemporaryDirectory() as tmp:
        junit, figures = Path(tmp) / "junit.xml", Path(tmp) / "figures.json"
        env = {**os.environ, "PITSTOP_GPU_FIGURES": str(figures)}
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "tests/gpu",
            *(["-k", only] if only else []),
        ]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if not junit.exists():
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
            return proc.returncode or 1
        rows = outcomes(junit)
        measured = json.loads(figures.read_text()) if figures.exists() else {}
    print("\n".join(table(rows, measured)))
    if proc.returncode not in (0, 5):
        print(proc.stdout[-3000:])
    failed = sum(1 for _, status, _ in rows if status == "FAILED")
    print(f"{len(rows) - failed} of {len(rows)} checks passed or skipped; {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
