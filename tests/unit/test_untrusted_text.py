"""Strings pitstop did not write reach the terminal as text (issue 25 items 4 and 5).

Item 4, rich markup: a command argument ``[/a]`` stored in the history used to end every later ``history
list`` / ``compare`` in ``MarkupError``; ``--html '[/y].html'`` wrote the file, then exited 1 (history record
and the job's exit code lost); ``--history '/tmp/h/[red]x/h.db'`` printed a wrong path. Item 5, control
sequences: a hyperlink (``ESC ]8;;``) or a screen clear (``ESC [2J``) in a config value or a file name
reached the terminal. Output captured here is not a terminal, so rich adds no escape codes of its own: any
ESC byte in it came from the data.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from tests.factories import profile, steps
from tests.inprocess import cli
from tests.unit.test_history import run_doc

from pitstop.cli.outputs import Outputs
from pitstop.diagnose import diagnose
from pitstop.history import record
from pitstop.report.terminal import render
from pitstop.report.untrusted import as_text, markup, shown

HYPERLINK = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J"
HOSTILE = f"[/a][red]x{HYPERLINK}{CLEAR}\x9b31m\x07\r\u202e"


def test_shown_escapes_every_control_character_but_newline_and_tab() -> None:
    assert shown(HOSTILE) == (
        "[/a][red]x\\x1b]8;;https://evil.example\\x1b\\click\\x1b]8;;\\x1b\\\\x1b[2J\\x9b31m\\x07\\x0d\\u202e"
    )
    assert shown("a\tb\nc") == "a\tb\nc"
    assert shown("a\tb\nc", one_line=True) == "a\\tb\\nc"
    every = shown("".join(map(chr, range(256))), one_line=True)
    assert all(ord(c) >= 0x20 and not 0x7F <= ord(c) < 0xA0 for c in every)
    assert shown("ünïcödé → ✓") == "ünïcödé → ✓"  # printable text is left alone


def test_text_and_markup_helpers_print_what_was_written() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200)
    console.print(as_text("[/a] [red]x[/red]"))
    console.print(f"[dim]{markup('[/y].html')}[/dim]")
    assert out.getvalue().splitlines() == ["[/a] [red]x[/red]", "[/y].html"]


def _stored_hostile_runs(path: Path) -> None:
    for label in ("[red]x", f"lab{CLEAR}"):
        doc = run_doc()
        doc["command"] = ["python", "b.py", "[/a]", HYPERLINK]
        record(doc, "doctor", path, label=label)


def test_history_list_show_compare_with_markup_and_escapes_in_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "h.db"
    _stored_hostile_runs(path)
    for args in (["list"], ["show", "1"], ["compare", "1", "2"]):
        code, out, err = cli(capsys, monkeypatch, "history", *args, "--history", str(path))
        assert code == 0, (args, err)
        assert "\x1b" not in out + err and "\x07" not in out + err, args
        assert "[red]x" in out, args  # the label, shown as written
    code, out, _ = cli(capsys, monkeypatch, "history", "show", "1", "--history", str(path))
    assert "[/a]" in out and "\\x1b]8;;https://evil.example" in out


def test_html_name_and_history_path_with_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "[").mkdir()
    html = tmp_path / "[" / "y].html"
    history = tmp_path / "h" / "[red]x" / "h.db"
    outputs = Outputs(html=html, history=history, record=True)
    outputs.check()
    doc = run_doc()
    outputs.write(doc)
    run_id = outputs.remember(doc, "doctor")
    err = capsys.readouterr().err
    assert run_id == 1 and html.read_text().lower().startswith("<!doctype html>")
    assert f"report written to {html} (" in err
    assert f"recorded as run 1 in {history} (pitstop history show 1)" in err


def test_the_terminal_report_shows_escapes_from_files_as_text() -> None:
    prof = profile("cuda", steps(wall=0.15, data=0.001, real_frac=0.99, row_len=1024), util=97.0)
    prof.environment.gpu_name = f"H100{CLEAR}[/a]"
    prof.environment.model.model_type = f"llama{HYPERLINK}"
    diagnosis = diagnose(prof)
    diagnosis.notes.append(f"from a file: {HOSTILE}")
    out = io.StringIO()
    render(diagnosis, Console(file=out, width=160))
    text = out.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text
    assert "H100\\x1b[2J[/a]" in text and "llama\\x1b]8;;https://evil.example" in text


def test_check_on_a_config_named_and_filled_with_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / f"cfg{CLEAR}[red]x.json"
    config.write_text(json.dumps({"per_device_train_batch_size": 1, "dataloader_num_workers": 0}))
    model = tmp_path / "config.json"
    model.write_text(
        json.dumps(
            {
                "model_type": f"llama{HYPERLINK}[/a]",
                "hidden_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 8,
                "intermediate_size": 1024,
                "vocab_size": 1000,
            }
        )
    )
    code, out, err = cli(capsys, monkeypatch, "check", str(config), "--model", str(model))
    assert code == 0, err
    assert "\x1b" not in out + err
    assert "llama\\x1b]8;;https://evil.example" in out and "cfg\\x1b[2J[red]x.json" in out


def test_an_error_naming_a_hostile_path_stays_one_inert_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / f"gone{CLEAR}[/a].csv"
    code, _, err = cli(capsys, monkeypatch, "analyze", str(missing))
    assert code == 2 and "\x1b" not in err and len(err.strip().splitlines()) == 1
    assert "gone\\x1b[2J[/a].csv" in err


@pytest.mark.slow
def test_doctor_of_a_command_with_markup_stores_lists_and_writes_its_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's own runs: ``pitstop doctor --html '[/y].html' -- python b.py '[/a]'`` exits with the job's
    code, writes the page, records the run, and ``history list`` shows the command as written."""
    import sys

    from tests.conftest import SCRIPTS, run_pitstop

    loop = SCRIPTS / "plain_loop.py"
    script = tmp_path / "b.py"
    script.write_text(
        "import runpy, sys\n"
        f"sys.argv = [{str(loop)!r}, '--steps', '30', '--batch', '2', '--threads', '1']\n"
        f"runpy.run_path({str(loop)!r}, run_name='__main__')\n"
    )
    (tmp_path / "[").mkdir()
    history = tmp_path / "h" / "[red]x" / "h.db"
    proc = run_pitstop(
        "doctor", "--steps", "6", "--warmup", "2", "--html", "[/y].html", "--history", str(history), "--",
        sys.executable, str(script), "[/a]",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "internal error" not in proc.stderr and (tmp_path / "[" / "y].html").is_file()
    assert f"recorded as run 1 in {history}" in proc.stderr and "report written to [/y].html" in proc.stderr
    code, out, err = cli(capsys, monkeypatch, "history", "list", "--history", str(history))
    assert code == 0 and "internal error" not in err, err  # the table printed (was: MarkupError)
    code, out, err = cli(capsys, monkeypatch, "history", "list", "--json", "--history", str(history))
    assert json.loads(out)[0]["command"].endswith("b.py '[/a]'")  # shell-quoted, as stored
