"""Pure parts of the job's output relay (``runner.relay``) and the live feed: whether the terminal is at the start
of a line after the job's bytes, the newline before pitstop's own line, a redrawn bar as the terminal leaves it.
The relay's runs are in tests/integration/test_job_output.py."""

from __future__ import annotations

import io
from pathlib import Path

from pitstop.cli.live import as_drawn, fresh_line
from pitstop.runner.relay import LINE_STATE, at_line_start, ends_line, lines_before, mark_line_start


def test_newline_tracking() -> None:
    assert ends_line(True, b"") and not ends_line(False, b"")  # nothing written: unchanged
    assert ends_line(False, b"step 3\n")
    assert not ends_line(True, b"\r 30%|###   |")  # a bar redrawn in place leaves its line open
    assert not ends_line(True, b"done\n\r 40%")


def test_a_pitstop_line_after_an_open_bar_starts_a_new_line(tmp_path: Path) -> None:
    stream = io.StringIO()
    fresh_line(tmp_path, stream)  # no relay showed anything: no newline
    assert stream.getvalue() == ""
    (tmp_path / LINE_STATE).write_bytes(b"0")  # the relay's last byte shown was inside a line
    assert not at_line_start(tmp_path)
    fresh_line(tmp_path, stream)
    assert stream.getvalue() == "\n"
    assert at_line_start(tmp_path)  # pitstop's line ends its own line: no second newline
    fresh_line(tmp_path, stream)
    assert stream.getvalue() == "\n"
    mark_line_start(tmp_path)
    assert (tmp_path / LINE_STATE).read_bytes() == b"1"


def test_a_redrawn_bar_is_shown_as_the_terminal_leaves_it() -> None:
    drawn = as_drawn("\r  0%|   | 0/9\r 11%|#  | 1/9\r{'loss': 2.1}\n\r 22%|## | 2/9\n")
    assert drawn == "{'loss': 2.1}\n 22%|## | 2/9\n"


def test_lines_before_a_byte(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"one\ntwo\nthr")
    assert lines_before(log, 0) == 0
    assert lines_before(log, 4) == 1
    assert lines_before(log, 11) == 2


def test_the_feed_shows_the_job_s_output_up_to_pitstop_s_stop_only(tmp_path: Path) -> None:
    from pitstop.cli.live import Feed, PlainView
    from pitstop.wholerun.run import WholeRun
    from pitstop.wholerun.windows import WindowSpec

    log = tmp_path / "job-output.log"
    before = b"{'loss': 2.1}\n\r 40%|####  | 4/10"
    log.write_bytes(before)
    shown = io.StringIO()
    feed = Feed(WholeRun(WindowSpec(steps=4)), PlainView(shown, "doctor"), [], tmp_path)
    feed.log = log
    feed.tick(tmp_path)  # while the job runs: whole lines only
    assert shown.getvalue() == "{'loss': 2.1}\n"
    with log.open("ab") as f:  # pitstop stopped the job here; its reaction follows
        f.write(b"\nTraceback (most recent call last):\nKeyboardInterrupt\n")
    feed.until = len(before)
    feed.tick(tmp_path)
    assert shown.getvalue() == "{'loss': 2.1}\n 40%|####  | 4/10\n"  # the open bar, closed; no traceback
