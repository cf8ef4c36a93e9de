"""HTML reports opened in a real browser (headless Chromium driven by Playwright): every section and plot
renders, the page logs no console error and makes no network request, and large inputs stay small and
quick. Screenshots are kept under ``artifacts/screenshots`` (``$PITSTOP_ARTIFACTS`` to change it)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.profile import (
    GpuSample,
    GpuTime,
    IdleSplit,
    RankProfile,
    RunProfile,
    StepCategories,
    StepRecord,
    TraceStats,
)
from pitstop.diagnose import diagnose
from pitstop.report.html import render_html
from tests.conftest import ROOT, SCRIPTS, require_shared, run_pitstop
from tests.factories import environment

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("PITSTOP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("PITSTOP_ARTIFACTS", ROOT / "artifacts")) / "screenshots"
MAX_REPORT_BYTES = 1_000_000  # the README states these two bounds
MAX_OPEN_S = 5.0

if CHROMIUM is None:
    pytest.skip("no Chromium (.ci/run installs Debian's chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_report(browser: Any, html_path: Path, shot: str) -> tuple[Any, dict[str, Any]]:
    """Open the file; return the page and what it did: console errors, requests, seconds to load."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    seen: dict[str, Any] = {"errors": [], "requests": []}
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))
    started = time.perf_counter()
    page.goto(html_path.as_uri(), wait_until="load")
    seen["open_s"] = time.perf_counter() - started
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)
    return page, seen


def assert_rendered(page: Any, seen: dict[str, Any], sections: set[str], plots: set[str]) -> None:
    assert seen["errors"] == [], seen["errors"]
    assert seen["requests"] == [page.url], seen["requests"]  # the file itself, nothing else
    shown = set(page.eval_on_selector_all("section[data-section]", "els => els.map(e => e.dataset.section)"))
    assert sections <= shown, shown
    figures = page.eval_on_selector_all(
        "figure[data-plot]",
        """els => els.map(e => {
            const s = e.querySelector('svg'); const box = s.getBoundingClientRect();
            return [e.dataset.plot, box.width, box.height,
                    s.querySelectorAll('rect, polyline, path').length]; })""",
    )
    drawn = {name for name, w, h, marks in figures if w > 200 and h > 50 and marks > 0}
    assert plots <= drawn, (plots, figures)


def report_of(tmp_path: Path, doc: dict[str, Any], name: str) -> Path:
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / f"{name}.html"
    proc = run_pitstop("report", str(src), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_demo_run_report(browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "demo.html"
    proc = run_pitstop(
        "doctor", "--demo", "--quiet", "--steps", "16", "--warmup", "3", "--no-history", "--html", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    page, seen = open_report(browser, out, "demo-run")
    assert_rendered(
        page,
        seen,
        {"verdict", "findings", "plots", "environment"},
        {"step-breakdown", "step-breakdown-mean", "tokens-per-step"},
    )
    causes = set(page.eval_on_selector_all(".finding", "els => els.map(e => e.dataset.cause)"))
    assert {"padding_waste", "slow_attention"} <= causes
    button = page.locator(".finding button.copy").first
    button.click()
    page.wait_for_timeout(100)
    assert button.inner_text() in ("Copied", "Select and copy")
    assert seen["errors"] == []


def test_trace_analysis_report(browser: Any, tmp_path: Path) -> None:
    trace = (
        require_shared("traces") / "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    )
    out = tmp_path / "trace.html"
    proc = run_pitstop("analyze", str(trace), "--no-history", "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    page, seen = open_report(browser, out, "trace-analysis")
    assert_rendered(
        page,
        seen,
        {"verdict", "findings", "plots", "environment"},
        {"trace-categories", "trace-temporal", "trace-idle-split"},
    )


def test_tune_result_report(browser: Any, tmp_path: Path) -> None:
    doc_path = tmp_path / "tune.json"
    out = tmp_path / "tune.html"
    proc = run_pitstop(
        "tune", "--steps", "8", "--warmup", "2", "--only", "trim_padding,attention", "--no-history",
        "--json", str(doc_path), "--html", str(out), "--",
        sys.executable, str(SCRIPTS / "plain_loop.py"), "--steps", "10000", "--attn", "eager", "--pad-to", "256",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page, seen = open_report(browser, out, "tune-result")
    assert_rendered(page, seen, {"verdict", "trials", "environment"}, {"tune-bars"})
    rows = page.eval_on_selector_all("#trials tbody tr", "els => els.length")
    assert rows == len(json.loads(doc_path.read_text())["candidates"])


def test_history_report(browser: Any, tmp_path: Path) -> None:
    from pitstop.history import open_store, record
    from tests.factories import profile, steps

    db = tmp_path / "h.sqlite3"
    for wall in (0.10, 0.11, 0.09, 0.12):
        record(diagnose(profile("cpu", steps(wall=wall))).to_dict(), "doctor", db, label="main")
    with open_store(db) as store:
        runs = [r.to_dict() for r in store.list(limit=10)]
    page, seen = open_report(browser, report_of(tmp_path, runs, "history"), "history")
    assert_rendered(page, seen, {"verdict", "plots"}, {"history-line", "history-bars"})


def long_run(steps: int = 100_000) -> dict[str, Any]:
    rng = random.Random(0)
    records = []
    for i in range(steps):
        wall = 0.1 + rng.random() * 0.02
        records.append(
            StepRecord(
                index=i + 1, wall_s=wall, data_wait_s=0.01, forward_s=0.03, backward_s=0.05, optimizer_s=0.005,
                micro_batches=1, samples=8, tokens=8192, real_tokens=6000 + rng.randrange(1000), seq_len=1024,
            )
        )  # fmt: skip
    t = [0.0]
    for r in records:
        t.append(t[-1] + r.wall_s)
    samples = [
        GpuSample(t=i * 0.1, util=60 + 30 * math.sin(i / 50), mem_used=40 * 2**30, mem_total=80 * 2**30,
                  pcie_rx=2e8, pcie_tx=1e8)
        for i in range(int(t[-1] / 0.1))
    ]  # fmt: skip
    rank = RankProfile(
        warmup_steps=10, steps=records, gpu_samples=samples, window_start_t=0.0, window_end_t=t[-1],
        environment=environment("cuda", gpu_name="NVIDIA H100 80GB HBM3"),
    )  # fmt: skip
    return diagnose(RunProfile(source="test", ranks=[rank])).to_dict()


def wide_trace(ranks: int = 64) -> dict[str, Any]:
    rng = random.Random(1)
    profiles = []
    for r in range(ranks):
        step = 100 + rng.random() * 10
        trace = TraceStats(
            gpu_util=0.8,
            breakdown_ms=StepCategories(kernel=step * 0.7, communication=step * 0.2, cpu_exec=step * 0.1),
            temporal=GpuTime(compute=0.7, non_compute=0.2, idle=0.1),
            idle_split=IdleSplit(host_wait=0.5, kernel_wait=0.4, other=0.1),
        )  # fmt: skip
        profiles.append(
            RankProfile(rank=r, steps=[StepRecord(index=i, wall_s=step / 1000) for i in range(5)], trace=trace,
                        environment=environment("cuda", gpu_name="NVIDIA H100 80GB HBM3"))
        )  # fmt: skip
    return diagnose(RunProfile(source="trace", ranks=profiles)).to_dict()


@pytest.mark.parametrize("name", ["100k-step-run", "64-rank-trace"])
def test_large_inputs_stay_small_and_quick(browser: Any, tmp_path: Path, name: str) -> None:
    doc = long_run() if name == "100k-step-run" else wide_trace()
    out = tmp_path / f"{name}.html"
    out.write_text(render_html(doc), encoding="utf-8")
    size = out.stat().st_size
    assert size < MAX_REPORT_BYTES, size
    page, seen = open_report(browser, out, name)
    plots = (
        {"step-breakdown", "gpu-timeline", "tokens-per-step"}
        if name.startswith("100k")
        else {"trace-categories", "trace-per-rank", "per-rank-step"}
    )
    assert_rendered(page, seen, {"verdict", "plots"}, plots)
    assert seen["open_s"] < MAX_OPEN_S, seen["open_s"]
    print(f"{name}: {size / 1024:.0f} KiB, opened in {seen['open_s']:.2f} s")
