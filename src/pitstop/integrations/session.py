"""One observation session inside a training process: the shared core of ``watch`` and the callbacks.

The probe is the same one the zero-code runner injects; a session only installs it, and when the window
closes (or training ends) diagnoses this process's profile and renders / writes it. Under several ranks
every rank measures itself; rank 0 prints, and a ``{rank}`` in ``json_path`` gives each rank its file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pitstop.core.profile import RankProfile
from pitstop.core.vocabulary import Source
from pitstop.probe.config import ProbeConfig
from pitstop.probe.probe import Probe
from pitstop.runner.collect import merge


class Session:
    def __init__(
        self,
        steps: int | None = 50,
        warmup: int = 10,
        json_path: str | Path | None = None,
        report: bool = True,
        source: Source = Source.WATCH,
        live: bool | None = False,
    ) -> None:
        """``live``: show the watch's panel while steps run (None: only inside a Jupyter kernel)."""
        if steps is not None and steps < 1:
            raise ValueError("steps must be at least 1 (or None for every step)")
        if warmup < 0:
            raise ValueError("warmup must be >= 0")
        self.config = ProbeConfig(warmup=warmup, steps=steps, announce=False)
        self.json_path = json_path
        self.report = report
        self.source = source
        self.probe: Probe | None = None
        self.diagnosis: Any = None  # pitstop.diagnose.Diagnosis once the window closed
        self.live = live
        self.view: Any = None  # pitstop.report.live.View while the panel shows
        self._windows: Any = None  # pitstop.integrations.watching.InProcessWatch feeding it
        self.watching: Any = None  # InProcessWatch of pitstop.watch(mode="watch"): the whole block
        self.watch_report: Any = None  # its WholeRunReport once the block ended

    def start(self, trainer: Any = None) -> Session:
        if self.probe is None:
            self.probe = Probe(self.config, on_done=self._done, trainer=trainer).install()
            self._start_view(self.probe)
        return self

    def _start_view(self, probe: Probe) -> None:
        """The live panel (rank 0 only), fed after each step with the windows closed so far."""
        from pitstop.report.live import in_kernel

        wanted = in_kernel() if self.live is None else self.live
        if not wanted or probe.rank != 0:
            return
        from pitstop.integrations.watching import InProcessWatch
        from pitstop.report.live import make_view, small_window_steps
        from pitstop.wholerun.windows import WindowSpec

        self.view = make_view(command="watch", overall="over the window")
        self._windows = InProcessWatch(
            WindowSpec(small_window_steps(self.config.steps)), [], print_changes=False
        )
        windows, view = self._windows, self.view

        def feed() -> None:
            view.step(probe.builder.index)
            view.events(windows.poll(probe))

        probe.step_listeners.append(feed)

    def _close_view(self) -> None:
        if self.view is None or self.probe is None:
            return
        view, self.view = self.view, None
        try:
            events = self._windows.poll(self.probe) + self._windows.whole.finish()[0]
            view.events(events)
        finally:
            view.close()

    def stop(self) -> None:
        """Close the window now if it is still open (training ended first)."""
        if self.probe is not None and not self.probe.finished:
            if self.probe.records:
                self.probe.finish(reason="end")
            else:
                self.probe.hooks.remove()
        self._close_view()

    def _done(self, rank: RankProfile) -> None:
        from pitstop.diagnose import diagnose

        self._close_view()  # the panel's last state stays above the report
        if not rank.steps:
            return
        profile = merge([rank], self.source, self.config.steps)
        self.diagnosis = diagnose(profile)
        _add_savings(self.diagnosis)
        if self.json_path is not None:
            path = Path(str(self.json_path).replace("{rank}", str(rank.rank)))
            path.write_text(json.dumps(self.diagnosis.to_dict(), indent=1, default=str))
        if self.report and rank.rank == 0:
            from pitstop.report.terminal import render

            render(self.diagnosis)


def _add_savings(diagnosis: Any) -> None:
    """Each finding's saving over the steps the run has left (the Trainer's or Lightning's length, the price
    from $PITSTOP_PRICE_PER_GPU_HOUR) and the run's cost at that price, or the one note saying why there is
    no saving."""
    from pitstop.diagnose.savings import price_from_env

    diagnosis.add_savings(price_from_env())


class SessionCallback:
    """What the framework callbacks share: a session made from the same arguments, and its diagnosis.
    ``mode="watch"``: the whole run is measured, windowed and sent to the job's own trackers (watching.py)."""

    def __init__(
        self,
        steps: int | None = 50,
        warmup: int = 10,
        json_path: str | Path | None = None,
        report: bool = True,
        mode: str = "window",
        window_steps: int = 200,
        window_seconds: float | None = None,
    ) -> None:
        if mode not in ("window", "watch"):
            raise ValueError("mode is 'window' (a short measured window) or 'watch' (the whole run)")
        self.mode = mode
        self.window = (window_steps, window_seconds)
        self.watching: Any = None  # pitstop.integrations.watching.InProcessWatch in watch mode
        self.session = Session(
            steps=None if mode == "watch" else steps,
            warmup=warmup,
            json_path=json_path,
            report=report,
            source=Source.CALLBACK,
        )

    @property
    def diagnosis(self) -> Any:
        return self.session.diagnosis
