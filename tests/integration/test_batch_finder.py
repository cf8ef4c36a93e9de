"""The runtime batch-size finder under a real memory cap (RLIMIT_AS), beside Lightning's binsearch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pitstop.plan.batch_finder import find_batch_size
from tests.conftest import SCRIPTS

pytestmark = pytest.mark.slow


def _capped(log: list[int], seen: dict[int, bool] | None = None) -> Any:
    """A step that runs one capped training step in a fresh interpreter (~4 s: it imports torch). With
    ``seen``, a size already measured under the cap is answered from there instead of run again."""

    def step(batch: int) -> None:
        log.append(batch)
        if seen is not None and batch in seen:
            fits = seen[batch]
        else:
            code = subprocess.run(
                [sys.executable, str(SCRIPTS / "capped_step.py"), str(batch)],
                capture_output=True,
                env={
                    **os.environ,
                    "MALLOC_ARENA_MAX": "1",
                },  # one malloc arena: the cap binds the same way each run
            ).returncode
            assert code in (0, 3), code
            fits = code == 0
            if seen is not None:
                seen[batch] = fits
        if not fits:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    return step


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:DeprecationWarning")  # inside Lightning's own code
def test_finds_the_true_limit_in_fewer_trials_than_lightning_binsearch(tmp_path: Path) -> None:
    # the true limit by bisection over 1..63 (a step's memory grows with its batch): 6 capped runs where a scan
    # from 1 took one per batch size up to the limit, each a fresh interpreter importing torch
    measured: dict[int, bool] = {}  # batch size -> it ran under the cap (the scan's, then Lightning's)
    step = _capped([], measured)
    fits, fails = 0, 64
    while fails - fits > 1:
        mid = (fits + fails) // 2
        try:
            step(mid)
            fits = mid
        except RuntimeError:
            fails = mid
    true_limit = fits
    assert 3 <= true_limit < 60  # the cap binds somewhere sensible

    ours: list[int] = []
    result = find_batch_size(_capped(ours), predicted=true_limit + 3)  # a plan that is a little optimistic
    # at the boundary an address-space cap is not perfectly repeatable (a row is ~9 MiB of an 80 MiB budget):
    # the answer must be a boundary the finder itself saw, within one row of the scan's
    ran = {b for b, ok in result.trials if ok}
    failed = {b for b, ok in result.trials if not ok}
    assert result.largest in ran and result.largest + 1 in failed
    assert abs(result.largest - true_limit) <= 1
    assert result.trial_count == len(ours) <= 6

    L = pytest.importorskip("lightning")
    import torch
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader

    # Lightning's trials are counted one by one; a size the scan already ran under the cap answers from it
    # (its doubling from 2 meets the scan's powers of two), so each size costs one fresh interpreter at most
    theirs: list[int] = []
    real_step = _capped(theirs, measured)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def train_dataloader(self) -> DataLoader:
            return DataLoader(list(range(1 << 16)), batch_size=self.batch_size)

        def training_step(self, batch: Any, idx: int) -> Any:
            real_step(len(batch))
            return (self.anchor * 0).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD([self.anchor], lr=0.0)

    trainer = L.Trainer(
        accelerator="cpu",
        default_root_dir=str(tmp_path),  # Lightning saves and restores a checkpoint here
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    Tuner(trainer).scale_batch_size(Module(), mode="binsearch", init_val=2, steps_per_trial=1, max_trials=25)
    assert len(ours) < len(set(theirs))
