"""The one vocabulary of a step's phases (``vocabulary.Phase``): each member reads its StepRecord field, the
breakdown adds up to the step, and every renderer's words come from it, worded as the reports always were."""

from __future__ import annotations

import pytest

from pitstop.core.profile import StepRecord
from pitstop.core.vocabulary import Phase


def test_each_phase_is_the_step_field_it_names_and_the_breakdown_adds_up_to_the_step() -> None:
    step = StepRecord(
        index=1, wall_s=1.0, data_wait_s=0.1, forward_s=0.2, backward_s=0.4, optimizer_s=0.1, sync_s=0.05
    )
    assert {p: getattr(step, p) for p in Phase} == pytest.approx(
        {
            Phase.DATA_WAIT: 0.1,
            Phase.GENERATE: None,  # only a run that generates rollouts has it
            Phase.FORWARD: 0.2,
            Phase.BACKWARD: 0.4,
            Phase.OPTIMIZER: 0.1,
            Phase.OTHER: 0.2,
            Phase.SYNC: 0.05,
        }
    )
    assert sum(getattr(step, p) for p in Phase.breakdown()) == pytest.approx(step.wall_s)
    assert Phase.breakdown()[:4] == Phase.timed() and Phase.SYNC not in Phase.breakdown()
    assert Phase("other_s") is Phase.OTHER and f"{Phase.OTHER}" == "other_s"  # JSON keys as before


def test_every_phase_has_every_word_and_the_reports_keep_theirs() -> None:
    for p in Phase:
        assert all((p.word, p.label, p.window_label, p.noun, p.where, p.where_explained))
    assert [p.word for p in Phase.breakdown()] == ["data", "forward", "backward", "optimizer", "other"]
    assert [p.label for p in Phase.breakdown()] == ["data wait", "forward", "backward", "optimizer", "other"]
    assert Phase.OTHER.window_label == "between steps" and Phase.OTHER.noun == "time between steps"
    assert Phase.DATA_WAIT.where == "waiting for the DataLoader" and Phase.SYNC.noun == "synchronisation"
    assert Phase.OTHER.where_explained.startswith(
        "between steps (outside data, forward, backward and optimizer"
    )
