"""tune's reported gain on a newcomer's own Trainer script beside the same change made by hand.

The job is ``tests/scripts/newcomer_trainer.py`` (unseeded, every example padded to ``max_length`` by the
tokenizer, eager attention). One run of this script: ``pitstop tune`` on the job as written, then, for each fix
tune measured that a user makes by editing one line, an interleaved A/B of the script and its edited copy run
without pitstop (A B A B ...), timed from the Trainer's own ``train_runtime`` over the same steps. The hand
ratio is the mean A step time over the mean B step time; the A runs' disagreement is its noise.

    python bench/newcomer_ab.py                   # tune with a 5-minute budget, then 3 A/B pairs per edit
    python bench/newcomer_ab.py --budget 300 --pairs 3 --steps 30 --json /tmp/newcomer_ab.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "tests" / "scripts" / "newcomer_trainer.py"
# the edit a user makes for each fix tune tries, as (the line's text, what it becomes)
EDITS: dict[str, tuple[str, str]] = {
    "trim_padding": ('padding="max_length", ', ""),  # the collator already pads each batch to its longest row
    "attention": ('attn_implementation="eager"', 'attn_implementation="sdpa"'),
}
RUNTIME = re.compile(r"'train_runtime': '?([0-9.]+)")


def tune(budget_s: int, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "pitstop", "tune", "--budget", f"{budget_s}s", "--no-history",
        "--json", str(out), "--", sys.executable, str(SCRIPT), "--steps", "100000",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def step_s(script: Path, steps: int) -> float:
    """Seconds per step of one plain run (no pitstop), from the Trainer's own train_runtime."""
    done = subprocess.run(
        [sys.executable, str(script), "--steps", str(steps)], check=True, capture_output=True, text=True
    )
    found = RUNTIME.findall(done.stdout + done.stderr)
    if not found:
        raise SystemExit(f"no train_runtime in the output of {script}")
    return float(found[-1]) / steps


def by_hand(fix: str, pairs: int, steps: int, work: Path) -> dict:
    old, new = EDITS[fix]
    text = SCRIPT.read_text()
    if old not in text:
        raise SystemExit(f"{SCRIPT.name} no longer holds {old!r}: update EDITS")
    edited = work / f"newcomer_{fix}.py"
    edited.write_text(text.replace(old, new))
    a: list[float] = []
    b: list[float] = []
    for _ in range(pairs):
        a.append(step_s(SCRIPT, steps))
        b.append(step_s(edited, steps))
    return {
        "fix": fix,
        "edit": f"{old!r} -> {new!r}",
        "speedup": statistics.fmean(a) / statistics.fmean(b),
        "noise": (max(a) - min(a)) / statistics.fmean(a),
        "a_step_s": a,
        "b_step_s": b,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=300, help="tune's budget, seconds")
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs per edit")
    parser.add_argument("--steps", type=int, default=30, help="steps per plain run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        doc = tune(args.budget, work / "tune.json")
        rows = []
        for c in doc["candidates"]:
            hand = by_hand(c["fix"], args.pairs, args.steps, work) if c["fix"] in EDITS else None
            rows.append({"fix": c["fix"], "tune": c.get("speedup"), "tune_spread": c.get("spread"),
                         "status": c.get("status"), "gain_basis": c.get("gain_basis"), "hand": hand})  # fmt: skip
    print("| fix | tune (status) | by hand (the edit, A/B without pitstop) |")
    print("| --- | --- | --- |")
    for r in rows:
        tuned = f"×{r['tune']:.2f} ±{r['tune_spread']:.0%}" if r["tune"] else "–"
        h = r["hand"]
        hand = f"×{h['speedup']:.2f} (A noise {h['noise']:.0%}; {h['edit']})" if h else "no one-line edit"
        print(f"| {r['fix']} | {tuned} ({r['status']}) | {hand} |")
    combined = doc.get("combined")
    if combined:
        print(
            f"combined {' + '.join(combined['fixes'])}: ×{combined['speedup'] or 0:.2f} ({combined['status']})"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "combined": combined, "tune": doc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
