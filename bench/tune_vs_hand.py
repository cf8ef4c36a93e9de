"""`pitstop tune` against a hand-tuned job: does tuning from outside reach what an engineer's rewrite gets?

The built-in demo has a naive version (text tokenized in the loop, rows padded to a fixed length, eager
attention) and a hand-fixed one (tokenized up front, packed into full rows, SDPA). Each round runs
``pitstop doctor --demo --fixed`` (naive and hand-fixed, back to back) and ``pitstop tune --demo``, and
prints tune's best real tokens/s as a ratio of the naive and of the hand-fixed run of the same round.

    python bench/tune_vs_hand.py              # 3 rounds, about 5 minutes on a 2-core CPU
    python bench/tune_vs_hand.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def pitstop(*args: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "pitstop", *args, "--no-history", "--json", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for i in range(args.rounds):
        hand = pitstop("doctor", "--demo", "--fixed", "--quiet")["demo_comparison"]
        tuned = pitstop("tune", "--demo")
        best = tuned["best"] or {"real_tokens_per_s": tuned["baseline"]["real_tokens_per_s"], "fixes": []}
        row = {
            "naive": hand["naive_real_tokens_per_s"],
            "hand": hand["fixed_real_tokens_per_s"],
            "tune_baseline": tuned["baseline"]["real_tokens_per_s"],
            "tune_best": best["real_tokens_per_s"],
            "fixes": best["fixes"],
            "tune_s": tuned["elapsed_s"],
        }
        rows.append(row)
        print(
            f"round {i + 1}: naive {row['naive']:,.0f}, hand-fixed {row['hand']:,.0f}, "
            f"tune {row['tune_best']:,.0f} real tokens/s ({' + '.join(row['fixes']) or 'no fix'}, "
            f"{row['tune_s']:.0f} s); tune/naive ×{row['tune_best'] / row['naive']:.2f}, "
            f"tune/hand ×{row['tune_best'] / row['hand']:.2f}",
            flush=True,
        )
    vs_naive = [r["tune_best"] / r["naive"] for r in rows]
    vs_hand = [r["tune_best"] / r["hand"] for r in rows]
    hand = [r["hand"] / r["naive"] for r in rows]
    print(
        f"median over {len(rows)} rounds: hand-fixed/naive ×{statistics.median(hand):.2f}, "
        f"tune/naive ×{statistics.median(vs_naive):.2f}, tune/hand-fixed ×{statistics.median(vs_hand):.2f} "
        f"(range ×{min(vs_hand):.2f}–×{max(vs_hand):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
