"""A Hugging Face Trainer callback (works for TRL's trainers too).

from pitstop.integrations.hf import PitstopCallback
trainer = Trainer(..., callbacks=[PitstopCallback(steps=50, json_path="run.json")])
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("pitstop's Trainer callback needs transformers: pip install 'pitstop[hf]'") from exc

from pitstop.integrations.session import SessionCallback


class PitstopCallback(SessionCallback, TrainerCallback):
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.start()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.stop()
