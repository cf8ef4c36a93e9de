"""The pitstop CLI called in this process, as ``python -m pitstop`` would run it (``main()``: the same one-line
errors and exit codes), for unit tests that need no fresh interpreter."""

from __future__ import annotations

import sys

import pytest


def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    """``pitstop ARGS``: (exit code, stdout, stderr)."""
    from pitstop.cli.app import main

    monkeypatch.setattr(sys, "argv", ["pitstop", *args])
    monkeypatch.setenv("COLUMNS", "200")
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
