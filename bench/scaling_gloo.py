"""Scaling efficiency of a gloo DDP job at 1, 2 and 4 ranks, measured by `pitstop doctor` on each.

Each run has the same per-rank batch (DDP's weak scaling). Two figures per world size: the measured one
(job tokens/s over world size × the 1-rank run's tokens/s) and the one doctor derives from the run alone
(each rank's step without its communication and waiting), so the two can be compared.

    python bench/scaling_gloo.py                 # 1, 2, 4 ranks
    python bench/scaling_gloo.py --ranks 1 2     # fewer
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "ddp_ranks.py"


def doctor(ranks: int, steps: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "pitstop", "doctor", "--quiet", "--no-history", "--warmup", "3"]
    cmd += ["--steps", str(steps), "--json", str(out), "--"]
    cmd += [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), str(SCRIPT)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return dict(json.loads(out.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            doc = doctor(n, args.steps, Path(tmp) / f"r{n}.json")
            scaling = doc.get("scaling") or {}
            ranks = doc["ranks"]
            rows.append(
                {
                    "ranks": n,
                    "tokens_per_s": doc["metrics"]["real_tokens_per_s"],
                    "step_s": doc["metrics"]["step_time_s"],
                    "derived_efficiency": scaling.get("efficiency"),
                    "lost": scaling.get("lost"),
                    "wait_frac": [round(r.get("wait_s", 0) / r["step_time_s"], 3) for r in ranks],
                    "comm_frac": [round(r.get("comm_s", 0) / r["step_time_s"], 3) for r in ranks],
                }
            )
    one = next((r["tokens_per_s"] for r in rows if r["ranks"] == 1), None)
    print(
        f"{'ranks':>5} {'tokens/s':>10} {'s/step':>8} {'measured eff.':>14} {'derived eff.':>13}  lost (derived)"
    )
    for r in rows:
        r["measured_efficiency"] = None if not one else r["tokens_per_s"] / (r["ranks"] * one)
        meas = "-" if r["measured_efficiency"] is None else f"{r['measured_efficiency']:.0%}"
        der = "-" if r["derived_efficiency"] is None else f"{r['derived_efficiency']:.0%}"
        lost = ", ".join(f"{k} {v:.0%}" for k, v in (r["lost"] or {}).items())
        print(f"{r['ranks']:>5} {r['tokens_per_s']:>10,.0f} {r['step_s']:>8.3f} {meas:>14} {der:>13}  {lost}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
