"""A real Jupyter kernel runs pitstop: a training loop under ``pitstop.watch()`` (its live panel a display
updated in place, not terminal escapes), the Diagnosis it leaves displayed as the HTML report, and a history
comparison and run list displayed as tables (nbclient + ipykernel, as in CI)."""

from __future__ import annotations

import html
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.slow

CELLS = [
    f"import sys; sys.path.insert(0, {str(SCRIPTS)!r})",
    """\
import torch, pitstop
from torch.utils.data import DataLoader
from common import TokenDataset, examples, pad_collate, tiny_llama
torch.set_num_threads(1)
model = tiny_llama("sdpa")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(TokenDataset(examples(128, 0), slow_ms=20), batch_size=4, collate_fn=pad_collate(None))
with pitstop.watch(steps=12, warmup=2, report=False) as session:
    for batch in loader:
        model(**batch).loss.backward(); opt.step(); opt.zero_grad()""",
    "session.diagnosis",
    """\
from pitstop.history import compare_runs, open_store, record
doc = session.diagnosis.to_dict()
first, second = record(doc, "doctor", label="main"), record(doc, "doctor", label="branch")
store = open_store()
runs = store.list()
comparison = compare_runs(store.get(first), store.get(second))
comparison""",
    "runs",
]


def test_a_notebook_runs_pitstop_and_shows_the_report(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.km_kwargs = {"kernel_cmd": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]}
    client.execute()
    (out,) = [o for o in nb.cells[2].outputs if o.get("output_type") == "execute_result"]
    frame = out["data"]["text/html"]
    page = html.unescape(frame)
    assert frame.startswith("<iframe srcdoc=")
    assert "why this run is slow" in page and "dataloader_bound" in page  # 4 × 20 ms reads a step, no workers

    _the_live_panel_was_a_display(nb.cells[1].outputs)
    (comparison,) = [o for o in nb.cells[3].outputs if o.get("output_type") == "execute_result"]
    table = comparison["data"]["text/html"]
    assert table.startswith("<table") and "run #1 (main)" in table and "run #2 (branch)" in table
    assert "real tokens/s" in table and "×1.00" in table and "Same setup" in table
    (runs,) = [o for o in nb.cells[4].outputs if o.get("output_type") == "execute_result"]
    assert "pitstop history: 2 runs" in runs["data"]["text/html"]


def _the_live_panel_was_a_display(outputs: list[dict[str, object]]) -> None:
    shown = [o for o in outputs if o.get("output_type") == "display_data"]
    assert len(shown) == 1, outputs  # one display, updated in place (not one per window)
    panel = html.unescape(shown[0]["data"]["text/html"])  # type: ignore[index]
    assert "pitstop watch" in panel and "over the window" in panel and "top finding" in panel
    streams = "".join(str(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    assert "\x1b[" not in streams and "\x1b[" not in panel  # no terminal escape codes in the notebook
