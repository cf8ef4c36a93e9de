"""Time and money each fix would save over the rest of the run (issue 30 item 4): the run's length from what
drives it (the Trainer, Lightning, trainer_state.json, a config, --total-steps), the steps left, and the saving
in the JSON document, the terminal, the HTML report, the history and the trackers' tables."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from tests.factories import profile, steps
from typer.testing import CliRunner

from pitstop.cli.analyze import run_analyze
from pitstop.cli.app import app
from pitstop.cli.doctor import run_doctor
from pitstop.cli.errors import UserError
from pitstop.cli.money import resolve_price, resolve_total_steps
from pitstop.cli.outputs import Outputs
from pitstop.core.findings import Saving
from pitstop.core.profile import DataLoaderInfo, Environment, RunProfile, RunTotals
from pitstop.core.vocabulary import CauseId, Source
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.diagnose.document import read_run
from pitstop.diagnose.savings import (
    UNKNOWN,
    add_savings,
    gpus_paid,
    parse_price,
    parse_total_steps,
    price_from_env,
    run_length,
    step_seconds,
    steps_done,
)
from pitstop.history import open_store
from pitstop.ingest.configs import read_config
from pitstop.ingest.hf_outputs import read_trainer_outputs
from pitstop.probe.environment import run_length as probe_run_length
from pitstop.report.html import render_html
from pitstop.report.terminal import render
from pitstop.report.trackers import FINDING_COLUMNS, findings_markdown, findings_rows
from pitstop.wholerun.run import WholeRunReport
from pitstop.wholerun.windows import WindowSpec

TRAINER = "the Trainer's max_steps"


def loader_bound(ranks: int = 1, device: str = "cuda", **env: Any) -> RunProfile:
    """A doctor run whose step waits 40 % on a DataLoader without workers: dataloader_bound, est. ×1/(1−0.4)."""
    p = profile(
        device,
        steps(n=20, wall=0.1, data=0.04),
        ranks=ranks,
        dataloader=DataLoaderInfo(num_workers=0, batch_size=8),
        **env,
    )
    p.source = Source.DOCTOR
    return p


def diagnosed(
    p: RunProfile, price: float | None = None, total: int | None = None
) -> tuple[Diagnosis, str | None]:
    d = diagnose(p)
    return d, add_savings(d.findings, d.profile, d.metrics, price, total)


def loader_finding(d: Diagnosis) -> Any:
    return next(f for f in d.findings if f.cause == CauseId.DATALOADER_BOUND)


def test_saving_over_the_steps_left_in_time_gpu_hours_and_money() -> None:
    d, note = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER, step_offset=0), price=2.5)
    assert note is None
    f = loader_finding(d)
    assert f.est_speedup == pytest.approx(1 / 0.6)
    s = f.saving
    assert s is not None
    # 20 steps done of 1,000: 980 left × 0.1 s × (1 − 0.6)
    assert (s.remaining_steps, s.total_steps, s.gpus, s.length_from) == (980, 1000, 1, TRAINER)
    assert s.seconds == pytest.approx(980 * 0.1 * 0.4)
    assert s.gpu_hours == pytest.approx(s.seconds / 3600)
    assert s.money == pytest.approx(s.gpu_hours * 2.5) and s.price_per_gpu_hour == 2.5


def test_every_gpu_of_the_job_is_paid_for() -> None:
    d, _ = diagnosed(
        loader_bound(ranks=4, total_steps=1000, total_steps_from=TRAINER, world_size=4), price=2.0
    )
    s = loader_finding(d).saving
    assert s is not None and s.gpus == 4
    assert s.gpu_hours == pytest.approx(s.seconds * 4 / 3600) and s.money == pytest.approx(s.gpu_hours * 2.0)


def test_a_resumed_run_counts_from_its_own_step() -> None:
    # the Trainer had done 500 steps before this process; the probe's last step is its 20th
    d, _ = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER, step_offset=500))
    s = loader_finding(d).saving
    assert s is not None and s.remaining_steps == 480 and s.money is None


def test_unknown_length_is_said_once_and_never_guessed() -> None:
    p = loader_bound(framework="pytorch")  # a plain loop: no total
    d, note = diagnosed(p, price=2.0)
    assert note == UNKNOWN and "--total-steps" in note
    assert all(f.saving is None for f in d.findings)
    d, note = diagnosed(p, total=5000)  # the user's --total-steps
    s = loader_finding(d).saving
    assert note is None and s is not None and (s.remaining_steps, s.length_from) == (4980, "--total-steps")


def test_the_users_total_wins_over_the_runs() -> None:
    p = loader_bound(total_steps=1000, total_steps_from=TRAINER)
    length = run_length(p, 3000)
    assert length is not None and (length.total_steps, length.remaining, length.source) == (
        3000,
        2980,
        "--total-steps",
    )


def test_a_finished_run_has_nothing_left_and_says_so() -> None:
    d, note = diagnosed(loader_bound(total_steps=20, total_steps_from=TRAINER))
    assert note is not None and "all its 20 steps" in note
    assert all(f.saving is None for f in d.findings)


def test_findings_without_an_estimate_get_no_saving_and_no_note() -> None:
    p = profile("cpu", steps(wall=0.15, data=0.001, real_frac=0.99), total_steps=1000)
    p.source = Source.DOCTOR
    d, note = diagnosed(p)
    assert note is None and all(f.saving is None for f in d.findings if not f.est_speedup)


def test_offline_steps_done_come_from_the_trainer_not_a_traces_step_numbers() -> None:
    p = loader_bound(total_steps=1000)
    p.source = Source.ANALYZE
    assert steps_done(p) is None  # a trace's ProfilerStep numbers are not the run's
    p.totals = RunTotals(steps=400, train_s=100.0)
    assert steps_done(p) == 400


def test_the_trainer_and_lightning_say_their_length() -> None:
    hf = SimpleNamespace(
        args=SimpleNamespace(max_steps=-1, num_train_epochs=3),
        state=SimpleNamespace(max_steps=1200, global_step=300),
    )
    env = Environment()
    probe_run_length(hf, env)
    assert (env.total_steps, env.step_offset) == (1200, 300) and "num_train_epochs" in (
        env.total_steps_from or ""
    )
    hf.args.max_steps = 1200
    probe_run_length(hf, env)
    assert env.total_steps_from == TRAINER
    lightning = SimpleNamespace(max_steps=-1, estimated_stepping_batches=640, global_step=0)
    env = Environment()
    probe_run_length(lightning, env)
    assert (env.total_steps, env.total_steps_from, env.step_offset) == (
        640,
        "Lightning's max_epochs × batches per epoch",
        0,
    )
    endless = SimpleNamespace(max_steps=-1, estimated_stepping_batches=float("inf"), global_step=0)
    env = Environment()
    probe_run_length(endless, env)
    probe_run_length(None, env)  # a plain loop
    assert env.total_steps is None and env.total_steps_from is None


def test_trainer_state_and_a_training_config_say_max_steps(tmp_path: Path) -> None:
    state = {"log_history": [], "global_step": 250, "max_steps": 1000, "train_batch_size": 8}
    out = read_trainer_outputs(state, "trainer_state.json")
    assert (out.env.total_steps, out.env.total_steps_from) == (1000, "trainer_state.json max_steps")
    path = tmp_path / "training_args.json"
    args = {"per_device_train_batch_size": 8, "learning_rate": 1e-4, "max_steps": -1}
    assert (
        read_config(args, "hf_args", path).env.total_steps is None
    )  # -1: by epochs, steps per epoch unknown
    facts = read_config(args | {"max_steps": 900}, "hf_args", path)
    assert (facts.env.total_steps, facts.env.total_steps_from) == (900, "max_steps in the training config")


def test_the_saving_round_trips_through_the_document_and_old_documents_still_read() -> None:
    d, _ = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER), price=2.0)
    doc = json.loads(json.dumps(d.to_dict()))
    saved = next(f for f in doc["findings"] if f["cause"] == "dataloader_bound")["saving"]
    assert saved["remaining_steps"] == 980 and saved["money"] == pytest.approx(0.02, abs=0.005)
    back = loader_finding(read_run(doc)).saving
    assert back is not None and back.seconds == pytest.approx(39.2) and back.length_from == TRAINER
    for f in doc["findings"]:
        f.pop("saving")  # a document written before savings
    assert loader_finding(read_run(doc)).saving is None
    assert Saving.from_dict({"seconds": "a lot"}) is None  # a damaged one is no saving, not a refusal


def test_terminal_and_html_show_the_saving_and_where_it_comes_from() -> None:
    d, _ = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER), price=2.0)
    buffer = io.StringIO()
    render(d, Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert (
        "Saved over the rest of the run: 980 of 1,000 steps left (the Trainer's max_steps) at 0.1 s/step"
        in text
    )
    assert "saves     39 s ($0.02) over the 980 steps left" in text
    page = render_html(json.loads(json.dumps(d.to_dict(), default=str)))  # read back from the document
    assert "<b>Saves:</b> 39 s ($0.02) over the 980 steps left" in page


def test_the_unknown_length_note_shows_once_in_the_report() -> None:
    d, note = diagnosed(loader_bound(framework="pytorch"))
    assert note is not None
    d.notes.append(note)
    buffer = io.StringIO()
    render(d, Console(file=buffer, width=300))
    assert buffer.getvalue().count("the run's length is unknown") == 1


def test_trackers_tables_carry_the_saving() -> None:
    d, _ = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER), price=2.0)
    rows = findings_rows(d.findings)
    row = dict(zip(FINDING_COLUMNS, rows[0], strict=True))
    assert row["saved_s"] == pytest.approx(39.2) and row["saved_money"] == pytest.approx(0.0218, abs=1e-3)
    markdown = findings_markdown(WholeRunReport(WindowSpec(), [], [], [], [], 0, 0.0), d.findings)
    assert "| saves |" in markdown and "39 s ($0.02) over the 980 steps left" in markdown


def test_history_stores_the_saving(tmp_path: Path) -> None:
    d, _ = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER), price=2.0)
    with open_store(tmp_path / "h.db") as store:
        run_id = store.add(json.loads(json.dumps(d.to_dict(), default=str)), "doctor")
        record = store.get(run_id)
    assert record is not None and record.result is not None
    saved = [f["saving"] for f in record.result["findings"] if f["cause"] == "dataloader_bound"]
    assert saved[0]["seconds"] == pytest.approx(39.2)


def test_analyze_reads_the_length_from_trainer_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PITSTOP_PRICE_PER_GPU_HOUR", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    state = {
        "global_step": 250,
        "max_steps": 1000,
        "log_history": [{"train_runtime": 50.0, "train_samples_per_second": 40.0}],
        "train_batch_size": 8,
    }
    (run / "trainer_state.json").write_text(json.dumps(state))
    (run / "training_args.json").write_text(
        json.dumps({"per_device_train_batch_size": 8, "dataloader_num_workers": 0, "learning_rate": 1e-4})
    )
    out = tmp_path / "out.json"
    run_analyze([run], None, None, None, False, Outputs(json=out, record=False), price_per_gpu_hour=4.0)
    doc = json.loads(out.read_text())
    env = doc["profile"]["run_environment"]
    assert (env["total_steps"], env["total_steps_from"]) == (1000, "trainer_state.json max_steps")
    # a config alone estimates nothing, so nothing is saved and the length needs no note
    assert all(f["saving"] is None for f in doc["findings"]) and UNKNOWN not in doc["notes"]


def test_an_offline_run_counts_from_the_trainers_global_step() -> None:
    p = loader_bound(total_steps=1000, total_steps_from="trainer_state.json max_steps")
    p.source = Source.ANALYZE  # a trace's steps: their step time is used, their numbers are not
    p.totals = RunTotals(steps=250, train_s=50.0)
    d, note = diagnosed(p)
    s = loader_finding(d).saving
    assert note is None and s is not None
    assert (s.remaining_steps, s.step_s) == (750, pytest.approx(0.1))
    assert step_seconds(
        replace(d.metrics, step_time_s=None), RunTotals(steps=250, train_s=60.0, eval_s=10.0)
    ) == (
        pytest.approx(0.2)
    )  # without measured steps: the Trainer's training time (evaluation out) over its steps


def test_doctor_refuses_a_bad_price_before_starting_the_run(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        run_doctor(
            ["python", "-c", "raise SystemExit(9)"],
            steps=5,
            warmup=1,
            full=False,
            quiet=True,
            timeout=None,
            outputs=Outputs(json=tmp_path / "out.json", record=False),
            price_per_gpu_hour=-3.0,
        )
    assert err.value.code == 2 and "--price-per-gpu-hour" in str(err.value)


def test_a_callbacks_price_comes_from_the_environment_and_a_bad_one_is_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PITSTOP_PRICE_PER_GPU_HOUR", "3.5")
    assert price_from_env() == 3.5
    monkeypatch.setenv(
        "PITSTOP_PRICE_PER_GPU_HOUR", "-1"
    )  # inside the user's job: no saving in money, no crash
    assert price_from_env() is None
    with pytest.raises(ValueError):
        parse_price("free")


def test_analyze_saves_over_trainer_state_steps_left_and_takes_total_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PITSTOP_PRICE_PER_GPU_HOUR", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    rows = "".join(f"GPU 0     0.985  0.31{i % 10}  0.110  0.21{i % 10}  0.240  512.0\n" for i in range(30))
    (run / "dmon.txt").write_text(  # utilization full, SMs a third busy: small_batch, with an estimate
        "#Entity   GRACT  SMACT  SMOCC  TENSO  DRAMA  POWER\nID                                  W\n" + rows
    )
    state = {"global_step": 250, "max_steps": 1000, "log_history": [{"train_runtime": 100.0}]}
    (run / "trainer_state.json").write_text(json.dumps(state))
    out = tmp_path / "out.json"

    def saving(**options: Any) -> dict[str, Any]:
        run_analyze([run], "h100", None, None, False, Outputs(json=out, record=False), **options)
        doc = json.loads(out.read_text())
        found = next(f for f in doc["findings"] if f["cause"] == "small_batch")
        assert found["est_speedup"] > 1
        return dict(found["saving"], est_speedup=found["est_speedup"])

    s = saving(
        price_per_gpu_hour="2.0"
    )  # as the command line gives it; 750 steps left at the Trainer's 100 s / 250 steps
    assert (s["remaining_steps"], s["step_s"], s["length_from"]) == (750, 0.4, "trainer_state.json max_steps")
    assert s["seconds"] == pytest.approx(750 * 0.4 * (1 - 1 / s["est_speedup"]), rel=1e-3)
    assert s["money"] == pytest.approx(s["gpu_hours"] * 2.0, abs=0.01)
    s = saving(total_steps="2000")
    assert (s["remaining_steps"], s["length_from"], s["money"]) == (1750, "--total-steps", None)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seconds", "nan"),
        ("gpu_hours", "inf"),
        ("step_s", "-inf"),
        ("money", "nan"),
        ("price_per_gpu_hour", "inf"),
    ],
)
def test_a_saving_that_is_not_a_finite_number_reads_as_none(field: str, value: str) -> None:
    good = Saving(39.2, 0.01, 980, 1000, 0.1, 1, TRAINER, 2.0, 0.02).to_dict()
    assert Saving.from_dict(good) is not None
    assert Saving.from_dict(good | {field: float(value)}) is None  # as json.loads reads NaN / Infinity
    assert Saving.from_dict(good | {field: value}) is None  # as a string
    assert Saving.from_dict(good | {"remaining_steps": float("inf")}) is None  # int(inf): OverflowError


BAD_OPTIONS = [
    (["--price-per-gpu-hour", "abc"], "--price-per-gpu-hour 'abc': not a price per GPU-hour"),
    (["--price-per-gpu-hour", "-1"], "--price-per-gpu-hour '-1': not a price"),  # as typed, not '-1.0'
    (["--price-per-gpu-hour", "nan"], "--price-per-gpu-hour 'nan': not a price"),
    (["--total-steps", "-5"], "--total-steps '-5': not a number of optimizer steps"),
    (["--total-steps", "0"], "--total-steps '0': not a number of optimizer steps"),
    (["--total-steps", "1e3"], "--total-steps '1e3': not a number of optimizer steps"),
    (["--total-steps", "2.5"], "--total-steps '2.5': not a number of optimizer steps"),
]


@pytest.mark.parametrize(("option", "said"), BAD_OPTIONS)
def test_doctor_refuses_a_bad_price_or_length_in_one_line_before_the_run(
    option: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PITSTOP_PRICE_PER_GPU_HOUR", raising=False)
    marker = tmp_path / "ran"  # the command would create it: a refusal comes before the job starts
    command = ["python", "-c", f"open({str(marker)!r}, 'w')"]
    result = CliRunner().invoke(app, ["doctor", "--no-history", *option, "--", *command])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line, no usage box
    assert said in result.stderr and "Usage" not in result.output and not marker.exists()


@pytest.mark.parametrize(("option", "said"), BAD_OPTIONS)
def test_analyze_refuses_a_bad_price_or_length_in_one_line(
    option: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PITSTOP_PRICE_PER_GPU_HOUR", raising=False)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": []}))
    result = CliRunner().invoke(app, ["analyze", str(tmp_path), "--no-history", *option])
    # the UserError reaches main(), which prints it as one line and exits with its code (test_dcgm does so too)
    assert isinstance(result.exception, UserError) and result.exception.code == 2, result.output
    assert said in str(result.exception) and "\n" not in str(result.exception)
    assert "Usage" not in result.output


def test_good_values_as_typed_and_from_code() -> None:
    assert (resolve_price("2.5"), resolve_price(2.5), resolve_price(" 3 ")) == (2.5, 2.5, 3.0)
    assert (resolve_total_steps("5000"), resolve_total_steps(" 1_000 "), resolve_total_steps(700)) == (
        5000,
        1000,
        700,
    )
    assert resolve_total_steps(None) is None and parse_total_steps("") is None
    for bad in ("-0", "+5", "１２", "10000000000000", "5 000"):
        with pytest.raises(ValueError):
            parse_total_steps(bad)
    with pytest.raises(UserError) as err:
        resolve_total_steps(0)
    assert err.value.code == 2 and str(err.value).startswith("--total-steps '0':")


def test_a_cpu_run_saves_wall_time_but_no_gpu_hours_nor_money() -> None:
    # a DDP job of 4 CPU processes: before, "GPU-h" and money at a GPU's price for 4 GPUs it never had
    d, note = diagnosed(
        loader_bound(ranks=4, device="cpu", world_size=4, total_steps=1000, total_steps_from=TRAINER),
        price=2.0,
    )
    s = loader_finding(d).saving
    assert note is None and s is not None
    assert s.seconds == pytest.approx(980 * 0.1 * 0.4)  # the wall time stays
    assert (s.gpus, s.gpu_hours, s.money, s.price_per_gpu_hour) == (0, 0.0, None, None)
    buffer = io.StringIO()
    render(d, Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert (
        "saves     39 s over the 980 steps left" in text
        and " GPU-h)" not in text
        and " GPU-h," not in text
        and "$" not in text
    )
    assert "on the CPU (wall time only: no GPU-hours, no money)" in text


def test_a_gpu_job_pays_for_one_gpu_per_process_not_for_those_it_sees() -> None:
    # gpu_count is the GPUs a process sees (torch.cuda.device_count(), a trace's devices): one process on a
    # node of 8 pays for the one it trains on, a DDP job for one per rank, whatever the source
    for source in (Source.DOCTOR, Source.ATTACH, Source.ANALYZE):
        p = loader_bound(total_steps=1000, total_steps_from=TRAINER, gpu_count=8, step_offset=0)
        p.source = source
        assert gpus_paid(p) == 1
    assert gpus_paid(loader_bound(ranks=8, world_size=8, gpu_count=8)) == 8
    d, _ = diagnosed(loader_bound(total_steps=1000, total_steps_from=TRAINER, gpu_count=8), price=2.0)
    s = loader_finding(d).saving
    assert s is not None and s.gpus == 1 and s.money == pytest.approx(s.seconds / 3600 * 2.0)
    unknown = loader_bound(ranks=2, world_size=2)
    unknown.ranks[0].environment.device = unknown.ranks[1].environment.device = None
    assert gpus_paid(unknown) == 2  # a device nobody said (offline files): one GPU per process, as before


def test_a_process_whose_model_spans_several_gpus_pays_for_each() -> None:
    # one process with a device map over 4 GPUs (of the 8 it sees): 4 GPU-hours an hour, not 1
    p = loader_bound(total_steps=1000, total_steps_from=TRAINER, gpu_count=8, step_offset=0, gpus_held=4)
    assert gpus_paid(p) == 4
    d, _ = diagnosed(p, price=2.0)
    s = loader_finding(d).saving
    assert s is not None and s.gpus == 4 and s.money == pytest.approx(s.seconds / 3600 * 4 * 2.0)
    # two of four ranks reported, each over 2 GPUs: the two silent ones are taken to hold as many
    two = loader_bound(ranks=2, world_size=4, gpus_held=2)
    assert gpus_paid(two) == 8


def test_attach_counts_steps_done_only_where_the_trainer_said_how_far_the_run_had_got() -> None:
    # the probe attach arms mid-run numbers steps from the arming: its 20th step is the run's 520th only where
    # the Trainer said it had done 500 when armed
    p = loader_bound(total_steps=1000, total_steps_from=TRAINER, step_offset=500)
    p.source = Source.ATTACH
    assert steps_done(p) == 520
    d, note = diagnosed(p, price=2.0)
    s = loader_finding(d).saving
    assert note is None and s is not None and s.remaining_steps == 480
    p = loader_bound(total_steps=1000, total_steps_from=TRAINER)  # a sampled view: no offset
    p.source = Source.ATTACH
    assert steps_done(p) is None  # not 20: every step counts as still to go, and a note says so
    d, note = diagnosed(p)
    assert note is not None and "how far the run had got is unknown" in note
