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
    """``PitstopCallback(mode="watch")`` watches the whole run and logs per window into the runs the Trainer's
    ``report_to`` opened (W&B, MLflow, TensorBoard's logging_dir)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.start()
        if self.mode == "watch" and self.watching is None:
            from pitstop.integrations.watching import InProcessWatch, tensorboard_dir, trainer_trackers
            from pitstop.wholerun.windows import WindowSpec

            trackers = trainer_trackers(getattr(args, "report_to", None), tensorboard_dir(args))
            self.watching = InProcessWatch(WindowSpec(*self.window), trackers)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watching is not None and self.session.probe is not None:
            self.session.probe.guard(self.watching.poll, self.session.probe)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe = self.session.probe
        if self.watching is not None and probe is not None and not probe.disabled:
            self.watching.poll(probe)
        self.session.stop()
        if self.watching is not None:
            findings = self.diagnosis.findings if self.diagnosis is not None else []
            self.watching.close(None, findings)
