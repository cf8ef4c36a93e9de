"""A Lightning callback.

from pitstop.integrations.lightning import PitstopCallback
trainer = L.Trainer(..., callbacks=[PitstopCallback(steps=50)])
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - exercised only without lightning
    raise ImportError("pitstop's Lightning callback needs lightning: pip install lightning") from exc

from pitstop.integrations.session import SessionCallback


class PitstopCallback(SessionCallback, Callback):
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start(trainer=trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.stop()
