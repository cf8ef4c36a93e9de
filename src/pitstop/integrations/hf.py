"""A Hugging Face Trainer callback (works for TRL's trainers too).

from pitstop.integrations.hf import PitstopCallback
trainer = Trainer(..., callbacks=[PitstopCallback(steps=50, json_path="run.json")])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("pitstop's Trainer callback needs transformers: pip install 'pitstop[hf]'") from exc

from pitstop.integrations.session import Session


class PitstopCallback(TrainerCallback):
    def __init__(
        self,
        steps: int | None = 50,
        warmup: int = 10,
        json_path: str | Path | None = None,
        report: bool = True,
    ) -> None:
        self.session = Session(
            steps=steps, warmup=warmup, json_path=json_path, report=report, source="callback"
        )

    @property
    def diagnosis(self) -> Any:
        return self.session.diagnosis

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.start()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.stop()
