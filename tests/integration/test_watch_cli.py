"""`pitstop watch` on real CPU trainings with planted late events: each is reported at the right step with the
right cause, the job runs to its end, and a steady run shows no change. Planted effects are several times the
step (a 2× slower machine still shows them): 4 examples × 40 ms of reads against a ~0.05 s step, an evaluation
of 0.6 s, a save of 0.4 s."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, run_pitstop

pytestmark = pytest.mark.slow

LOOP = [sys.executable, str(SCRIPTS / "plain_loop.py"), "--threads", "1", "--batch", "4", "--packed"]


def watch(
    tmp_path: Path, *loop_args: str, window: int = 40, extra: tuple[str, ...] = ()
) -> tuple[dict[str, Any], str]:
    out = tmp_path / "watch.json"
    proc = run_pitstop(
        "watch", "--window-steps", str(window), "--warmup", "5", "--json", str(out), *extra, "--",
        *LOOP, *loop_args, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout + proc.stderr


def _rates(w: dict[str, Any]) -> list[tuple[int, int, float]]:
    """Each window's first step and typical rate with its noise: what a failed assertion needs to be read."""
    return [
        (x["first_step"], round(x.get("typical_tokens_per_s") or 0), round(x.get("typical_noise") or 0, 3))
        for x in w["windows"]
    ]


def test_a_dataloader_that_slows_late_is_one_change_at_its_step(tmp_path: Path) -> None:
    # --min-drop 0.5: the planted drop is 80-85% (70% were the machine 2x slower); the machine's own moves
    # are not: a first window 48% slower than the rest (the suite's machine, not the job) was rightly
    # reported as a change "faster" at the default 10%, and this test is about the dataloader
    doc, text = watch(
        tmp_path,
        "--steps",
        "300",
        "--slow-after",
        "170",
        "--slow-after-ms",
        "40",
        extra=("--min-drop", "0.5"),
    )
    w = doc["watch"]
    assert w["steps"] == 295  # the whole run after the warm-up: the job was never stopped
    slower = [c for c in w["changes"] if c["kind"] == "slower"]
    assert len(slower) == 1, (w["changes"], _rates(w))
    assert 169 <= slower[0]["step"] <= 173  # reads slow from step 171's batch on
    assert slower[0]["part"] == "data_wait_s"
    assert slower[0]["after"] < 0.7 * slower[0]["before"]
    assert [c["cause"] for c in w["changes"] if c["kind"] == "new_finding"] == ["dataloader_bound"]
    assert "CHANGE (slower)" in text  # the append-only line (the output is not a terminal here)
    assert w["phases"][0]["first_step"] == 6 and len(w["phases"]) == 2
    assert (
        "dataloader_bound" in w["phases"][1]["findings"]
        and "dataloader_bound" not in w["phases"][0]["findings"]
    )


def test_evaluation_and_checkpoint_saves_are_found_by_their_period(tmp_path: Path) -> None:
    # --min-drop 0.4: this test is about the periods; a shared machine's load may shift the rate meanwhile
    doc, _ = watch(
        tmp_path, "--steps", "320", "--eval-every", "50", "--eval-s", "0.6", "--save-every", "70", "--save-s", "0.4",
        "--save-dir", str(tmp_path), extra=("--min-drop", "0.4"),
    )  # fmt: skip
    w = doc["watch"]
    assert [c for c in w["changes"] if c["kind"] in ("slower", "faster")] == []
    by_period = {s["period"]: s for s in w["periodic_stalls"]}
    assert set(by_period) == {50, 70}, w["periodic_stalls"]
    assert by_period[50]["first_step"] in (50, 51) and by_period[50]["count"] == 6  # 50, 100, ... 300
    assert by_period[70]["first_step"] in (70, 71) and by_period[70]["count"] == 4
    for s in by_period.values():
        assert s["part"] == "other_s"  # between steps: not data, forward, backward or the optimizer
    assert by_period[50]["mean_excess_s"] > by_period[70]["mean_excess_s"]  # 0.6 s against 0.4 s


def test_a_steady_run_has_no_change(tmp_path: Path) -> None:
    # The job itself is steady; the shared 2-core test machine is not: other jobs starting and ending moved this
    # very run's rate by 35% (a real change of the machine, rightly reported at the default 10%). --min-drop 0.5
    # keeps the machine out of it; the planted causes above move the rate by 60-80%. The default threshold's
    # steady case is tests/unit/test_wholerun.py's (synthetic noise, 2,000 steps, four seeds).
    doc, text = watch(tmp_path, "--steps", "1000", window=100, extra=("--min-drop", "0.5"))
    w = doc["watch"]
    assert w["steps"] == 995 and len(w["windows"]) == 10
    assert w["changes"] == [], (w["changes"], _rates(w))
    assert w["periodic_stalls"] == []
    assert "no change" in text


def test_a_rank_that_turns_slow_late_in_a_two_rank_run(tmp_path: Path) -> None:
    out = tmp_path / "watch.json"
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
    proc = run_pitstop(
        "watch", "--window-steps", "30", "--warmup", "5", "--json", str(out), "--",
        *torchrun, str(SCRIPTS / "ddp.py"), "--steps", "200", "--slow-rank", "1", "--slow-ms", "40",
        "--slow-after", "110", timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w = json.loads(out.read_text())["watch"]
    slower = [c for c in w["changes"] if c["kind"] == "slower"]
    assert len(slower) == 1 and 109 <= slower[0]["step"] <= 113, w["changes"]  # 4 × 40 ms reads from step 111
    new = {c["cause"]: c for c in w["changes"] if c["kind"] == "new_finding"}
    assert "straggler" in new and 109 <= new["straggler"]["step"] <= 113
    assert "rank 1" in new["straggler"]["text"].lower()
    assert "straggler" not in w["phases"][0]["findings"]
