"""Energy and cost where every report shows them: computed once with the savings (``Diagnosis.add_savings``),
worded once (``report/energy.py``) for the terminal and HTML, read back from a saved document, charted per
window by the trackers, and shown by ``pitstop history show``; nothing where nothing was measured."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from tests.factories import gpu_samples, profile, steps
from tests.inprocess import cli
from tests.trackers_read import tensorboard_events, wandb_history
from tests.unit.test_gpu_activity_energy import with_counter
from tests.unit.test_wholerun import series

from pitstop.core.profile import Environment
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.diagnose.cost import NO_GPU, NO_RATE, RunCost
from pitstop.diagnose.document import read_run
from pitstop.history import record
from pitstop.report.html import render_html
from pitstop.report.terminal import render
from pitstop.report.trackers import MlflowTracker, TensorBoardTracker, WandbTracker
from pitstop.wholerun.run import WholeRun, WholeRunReport
from pitstop.wholerun.windows import WindowSpec

REAL_TPS = 8 * 1024 / 0.1  # the factory's steps: 8 rows of 1024 real tokens every 0.1 s


def gpu_run(price: float | None = 3.6) -> Diagnosis:
    """One H100 whose energy counter rose 650 J a second, priced (or not)."""
    p = with_counter(profile("cuda", steps(wall=0.1), util=95.0), [1e6 + 650 * i for i in range(6)])
    d = diagnose(p)
    d.add_savings(price)
    return d


def cpu_run(price: float | None = 3.6) -> Diagnosis:
    d = diagnose(profile("cpu", steps(wall=0.1)))
    d.add_savings(price)
    return d


def terminal(d: Diagnosis) -> str:
    out = io.StringIO()
    render(d, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def row(text: str, label: str) -> str | None:
    """The headline row ``label`` says, without the panel's border; None where there is none."""
    for line in text.splitlines():
        cells = line.strip("│ ").split(None, 1)
        if len(cells) == 2 and cells[0] == label:
            return cells[1].strip()
    return None


def test_the_cost_is_computed_once_with_the_gpus_the_savings_bill() -> None:
    cost = gpu_run().cost
    assert cost is not None and (cost.price_per_gpu_hour, cost.gpus, cost.why) == (3.6, 1, None)
    assert cost.per_million_real_tokens == pytest.approx(3.6 / 3600 / REAL_TPS * 1e6)
    assert cost.per_hour == pytest.approx(3.6)
    assert gpu_run(None).cost is None  # no price: no cost, and no key filled in the JSON
    assert gpu_run(None).to_dict()["cost"] is None
    cpu = cpu_run().cost  # a CPU run pays for no GPU: no cost per token, and why
    assert cpu == RunCost(3.6, 0, None, None, NO_GPU)


def test_no_real_token_rate_means_no_cost_per_token_and_says_so() -> None:
    d = diagnose(profile("cuda", steps(wall=0.1, real_frac=1.0), util=95.0))
    d.metrics.real_tokens_per_s = None  # as a log without token counts
    d.add_savings(2.0)
    assert d.cost == RunCost(2.0, 1, None, 2.0, NO_RATE)
    assert row(terminal(d), "Cost") == f"{NO_RATE} (at $2 per GPU-hour)"


def test_the_terminal_shows_energy_and_cost_for_a_priced_gpu_run() -> None:
    text = terminal(gpu_run())
    energy = "GPUs draw 650 W together · 65 J per step · 0.00793 J per real token (from the energy counter)"
    assert row(text, "Energy") == energy
    assert row(text, "Cost") == "$0.01221 per million real tokens · $3.6 an hour (1 GPU at $3.6 per GPU-hour)"
    unpriced = terminal(gpu_run(None))  # measured energy, no price: the energy line alone
    assert row(unpriced, "Energy") == energy and row(unpriced, "Cost") is None


def test_a_cpu_run_has_no_energy_line_and_says_why_it_has_no_cost() -> None:
    text = terminal(cpu_run())
    assert row(text, "Energy") is None and "J per real token" not in text
    assert row(text, "Cost") == f"{NO_GPU} (at $3.6 per GPU-hour)"
    assert row(terminal(cpu_run(None)), "Cost") is None


def test_the_html_report_shows_the_same_lines_live_and_read_back() -> None:
    d = gpu_run()
    for html in (render_html(d), render_html(d.to_dict())):
        assert "<b>Energy:</b> GPUs draw 650 W together · 65 J per step" in html
        assert "<b>Cost:</b> $0.01221 per million real tokens" in html
    cpu = render_html(cpu_run().to_dict())
    assert 'data-figure="energy"' not in cpu and f"<b>Cost:</b> {NO_GPU}" in cpu


def test_a_saved_document_reads_its_cost_back_and_older_ones_still_read() -> None:
    d = gpu_run()
    doc = d.to_dict()
    assert read_run(doc).cost == d.cost
    del doc["cost"]  # written before every command carried it
    assert read_run(doc).cost is None
    doc["cost"] = {"price_per_gpu_hour": 3.6, "gpus": 1, "per_million_real_tokens": 0.0122}  # analyze's first
    assert read_run(doc).cost == RunCost(3.6, 1, 0.0122)


def gpu_watched(price: float | None = 2.0, device: str = "cuda") -> WholeRunReport:
    """Two windows of 100 steps on one GPU drawing 400 W (its NVML power samples); on a CPU, no samples."""
    run = WholeRun(WindowSpec(steps=100), price=price)
    records = series(200)
    env = Environment(device=device, world_size=1)
    for first in (0, 100):
        if device == "cuda":
            run.add_gpu(0, gpu_samples(95.0))
        run.add(0, records[first : first + 100], env)
    return run.finish()[1]


def test_each_window_carries_its_energy_and_cost_for_the_trackers() -> None:
    report = gpu_watched()
    assert len(report.windows) == 2
    for w in report.windows:
        scalars = w.scalars()
        rate = w.real_tokens_per_s
        assert rate is not None and scalars["gpu_power_w"] == pytest.approx(400)
        assert scalars["joules_per_real_token"] == pytest.approx(400 / rate)
        assert scalars["joules_per_step"] == pytest.approx(400 * (w.step_time_s or 0))
        assert scalars["cost_per_million_real_tokens"] == pytest.approx(2.0 / 3600 / rate * 1e6)
    assert "cost_per_million_real_tokens" not in gpu_watched(None).windows[0].scalars()
    cpu = gpu_watched(2.0, "cpu").windows[0].scalars()  # no GPU power, no GPU paid: both left out
    assert not {"gpu_power_w", "joules_per_real_token", "cost_per_million_real_tokens"} & set(cpu)
    assert "tokens_per_s" in cpu


def test_one_process_of_many_gets_no_window_cost() -> None:
    run = WholeRun(
        WindowSpec(steps=100), price=2.0, ranks=1
    )  # the in-process watch: its own rank of a 4-rank job
    run.add_gpu(0, gpu_samples(95.0))
    run.add(0, series(100), Environment(device="cuda", world_size=4))
    (window,) = run.finish()[1].windows
    assert window.cost_per_million_real_tokens is None and window.joules_per_real_token is not None


ENERGY_KEYS = ("gpu_power_w", "joules_per_step", "joules_per_real_token", "cost_per_million_real_tokens")


def test_tensorboard_charts_the_energy_and_cost_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    report = gpu_watched()
    tracker = TensorBoardTracker(tmp_path)
    for w in report.windows:
        tracker.log_window(w, [])
    tracker.finish(report, [])
    acc = tensorboard_events(tracker.folder)
    for key in ENERGY_KEYS:
        values = [e.value for e in acc.Scalars(f"pitstop/{key}")]
        assert values == pytest.approx([w.scalars()[key] for w in report.windows], rel=1e-6)


@pytest.mark.slow
def test_wandb_offline_run_holds_the_energy_and_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    report = gpu_watched()
    tracker = WandbTracker("test-energy")
    run_dir = Path(tracker.run.dir).parent
    for w in report.windows:
        tracker.log_window(w, [])
    tracker.finish(report, [])
    rows = [r for r in wandb_history(run_dir) if "pitstop/tokens_per_s" in r]
    for key in ENERGY_KEYS:
        assert [r[f"pitstop/{key}"] for r in rows] == pytest.approx(
            [w.scalars()[key] for w in report.windows]
        )


@pytest.mark.slow  # mlflow runs git once per process to note the source's commit
def test_mlflow_file_store_holds_the_energy_and_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    report = gpu_watched()
    tracker = MlflowTracker("test-energy")
    for w in report.windows:
        tracker.log_window(w, [])
    tracker.finish(report, [])
    client = MlflowClient()
    for key in ENERGY_KEYS:
        history = client.get_metric_history(tracker.run_id, f"pitstop/{key}")
        assert [m.step for m in history] == [w.last_step for w in report.windows]
        assert [m.value for m in history] == pytest.approx([w.scalars()[key] for w in report.windows])


def test_history_show_gives_energy_and_cost_per_real_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "h.db"
    priced = gpu_run().to_dict()
    old = gpu_run(None).to_dict()
    del old["cost"]
    del old["metrics"]["joules_per_real_token"]  # a document from before energy and cost
    for doc in (priced, old, cpu_run().to_dict()):
        record(doc, "doctor", path)
    code, out, err = cli(capsys, monkeypatch, "history", "show", "1", "--history", str(path))
    assert code == 0, err
    assert "energy per real token" in out and "0.00793 J" in out
    assert "cost per million real tokens" in out and "$0.01221" in out
    for run_id in ("2", "3"):  # nothing stored, nothing shown (a CPU run: no energy, no cost per token)
        code, out, err = cli(capsys, monkeypatch, "history", "show", run_id, "--history", str(path))
        assert code == 0 and "real tokens/s" in out, err
        assert "energy per real token" not in out and "cost per million" not in out


def test_history_compare_sets_energy_and_cost_per_real_token_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "h.db"
    for doc in (gpu_run().to_dict(), gpu_run().to_dict(), cpu_run().to_dict(), cpu_run().to_dict()):
        record(doc, "doctor", path)
    code, out, err = cli(capsys, monkeypatch, "history", "compare", "1", "2", "--history", str(path))
    assert code == 0, err
    energy = next(line for line in out.splitlines() if "energy per real token" in line)
    assert energy.count("0.00793 J") == 2 and "×1.00" in energy
    assert "cost per million real tokens" in out
    code, out, err = cli(capsys, monkeypatch, "history", "compare", "3", "4", "--history", str(path))
    assert code == 0 and "real tokens/s" in out, err
    assert "energy per real token" not in out  # CPU runs: nothing measured, no row


def test_history_check_gates_on_energy_per_real_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose energy per real token rose 25% is a 20% drop in real tokens per joule: past a 10% limit."""
    path = tmp_path / "h.db"
    base = gpu_run().to_dict()
    worse = gpu_run().to_dict()
    worse["metrics"]["joules_per_real_token"] = base["metrics"]["joules_per_real_token"] * 1.25
    record(base, "doctor", path, label="main")
    record(worse, "doctor", path)
    args = ("history", "check", "--baseline", "main", "--history", str(path))
    code, out, err = cli(capsys, monkeypatch, *args, "--metric", "joules_per_real_token", "--max-drop", "10%")
    assert code == 1 and "20.0% fewer real tokens per joule" in err, (out, err)
    code, out, err = cli(capsys, monkeypatch, *args, "--metric", "joules_per_real_token", "--max-drop", "25%")
    assert code == 0 and "within the 25% allowed" in out, (out, err)
    code, out, err = cli(capsys, monkeypatch, *args, "--metric", "watts")
    assert code == 2 and "joules_per_real_token" in err  # the unknown metric names the known ones
