"""The package root is the front door: it may point up to any layer, so nothing inside pitstop imports it
(tests/unit/test_layers.py holds that). What lower layers once took from it comes from the bottom layer, and
the root wires the rest in when it is imported (tests/unit/test_notebook_display.py shows the result)."""

from __future__ import annotations

import pytest

import pitstop
from pitstop import display, version


def test_the_root_names_the_bottom_layers_version() -> None:
    assert pitstop.__version__ == version.__version__


def test_importing_pitstop_plugs_a_renderer_into_notebook_display() -> None:
    assert display._render is not None  # a Diagnosis's or TuneResult's _repr_html_ asks for it


def test_without_a_renderer_a_result_shows_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(display, "_render", None)
    assert display.html_of(object()) is None  # IPython then shows the text repr
