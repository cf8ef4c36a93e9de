"""A self-contained HTML report of any saved pitstop result: a run (doctor, analyze), a tune result, or
history runs. One file, no network: CSS, the copy-button script and the SVG plots are all inline."""

from __future__ import annotations

from typing import Any

from pitstop import schemas
from pitstop.diagnose import Diagnosis
from pitstop.errors import PitstopError
from pitstop.report.errors import ReportError
from pitstop.report.html.page import page
from pitstop.version import __version__


def render_html(doc: Any) -> str:
    """A saved document (``pitstop.run/1`` is read back into a Diagnosis first) or a Diagnosis itself."""
    try:
        return _render(doc)
    except ReportError:
        raise
    except PitstopError as exc:  # a run document that cannot be read back
        raise ReportError(str(exc)) from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ReportError(f"the document is incomplete or damaged ({type(exc).__name__}: {exc})") from None


def _render(doc: Any) -> str:
    footer = f"pitstop {__version__} · self-contained report: no network, no external files"
    if isinstance(doc, Diagnosis) or (isinstance(doc, dict) and doc.get("schema") == schemas.RUN):
        from pitstop.diagnose.document import read_run
        from pitstop.report.html.run import run_sections, run_subtitle

        d = doc if isinstance(doc, Diagnosis) else read_run(doc)
        sections = run_sections(d)
        if isinstance(doc, dict) and isinstance(doc.get("watch"), dict):  # pitstop watch: the whole run
            from pitstop.report.html.watch import watch_section

            sections.insert(1, watch_section(doc["watch"]))
        return page("pitstop: why this run is slow", run_subtitle(d), sections, footer)
    if isinstance(doc, dict) and doc.get("schema") == schemas.TUNE:
        from pitstop.report.html.tune import tune_sections

        return page(
            "pitstop tune: measured on your job",
            " ".join(doc.get("command") or []),
            tune_sections(doc),
            footer,
        )
    runs = doc.get("runs") if isinstance(doc, dict) and doc.get("schema") == schemas.HISTORY else doc
    if (
        isinstance(runs, list)
        and runs
        and all(isinstance(r, dict) and "id" in r and "fingerprint" in r for r in runs)
    ):
        from pitstop.report.html.history import history_sections

        return page("pitstop history", f"{len(runs)} runs", history_sections(runs), footer)
    schema = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
    raise ReportError(
        f"not a pitstop result (schema {schema!r}); expected pitstop.run/1, pitstop.tune/1 or history runs"
    )
