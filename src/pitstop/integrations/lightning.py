"""A Lightning callback.

from pitstop.integrations.lightning import PitstopCallback
trainer = L.Trainer(..., callbacks=[PitstopCallback(steps=50)])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - exercised only without lightning
    raise ImportError("pitstop's Lightning callback needs lightning: pip install lightning") from exc

from pitstop.integrations.session import Session


class PitstopCallback(Callback):
    def __init__(
        self,
        steps: int | None = 50,
        warmup: int = 10,
        json_path: str | Path | None = None,
        report: bool = True,
    ) -> None:
        super().__init__()
        self.session = Session(
            steps=steps, warmup=warmup, json_path=json_path, report=report, source="callback"
        )

    @property
    def diagnosis(self) -> Any:
        return self.session.diagnosis

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start(trainer=trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.stop()
