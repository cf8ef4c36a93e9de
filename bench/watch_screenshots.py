"""Regenerate the README's pictures of ``pitstop watch``: the HTML report's whole-run section, the scalars it
logged to TensorBoard, and a text capture of the live terminal panel (all from one real CPU run).

    python bench/watch_screenshots.py            # writes docs/images/watch-*.png and watch-live-panel.txt

Needs Playwright with a Chromium (Debian's /usr/bin/chromium, or $PITSTOP_CHROMIUM) and tensorboard. Runs
offline: TensorBoard is started on 127.0.0.1 and stopped again. The W&B UI is a web service and is not shot.
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
LOOP = [
    sys.executable, str(ROOT / "tests" / "scripts" / "plain_loop.py"), "--threads", "1", "--batch", "4",
    "--packed", "--steps", "300", "--slow-after", "170", "--slow-after-ms", "40", "--eval-every", "50",
    "--eval-s", "0.6",
]  # fmt: skip
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_in_pty(args: list[str], columns: int = 100) -> str:
    """The command's output as a terminal shows it (what the live panel draws), escape codes included."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait()
    os.close(master)
    if proc.returncode != 0:
        raise SystemExit(f"pitstop watch ended with {proc.returncode}")
    return b"".join(chunks).decode("utf-8", errors="replace")


def last_panel(text: str) -> str:
    """The live panel's last frame, as plain text (a redraw may start mid-line, after the cursor moved up)."""
    plain = ANSI.sub("", text.replace("\r\n", "\n")).replace("\r", "\n")
    frames = []
    for m in re.finditer("╭─ pitstop watch ", plain):
        end = plain.find("╰", m.start())
        close = plain.find("╯", end)
        if end < 0 or close < 0:
            continue
        frame = plain[m.start() : close + 1]
        if "over the run" in frame:
            frames.append("\n".join(line.rstrip() for line in frame.split("\n")) + "\n")
    if not frames:
        raise SystemExit("no live panel in the captured output")
    return frames[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shoot(work: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("PITSTOP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    port = free_port()
    board = subprocess.Popen(
        [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(work / "runs"), "--host",
         "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto((work / "run.html").as_uri())
            section = page.locator('[data-section="watch"]')
            section.screenshot(path=str(IMAGES / "watch-report.png"))
            _tensorboard(page, port)
            browser.close()
    finally:
        board.terminate()
        board.wait(timeout=30)


def _tensorboard(page: object, port: int) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            page.goto(f"http://127.0.0.1:{port}/?smoothing=0#scalars&tagFilter=pitstop")  # type: ignore[attr-defined]
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    page.wait_for_selector("canvas, svg.line-chart, tf-scalar-card, .chart", timeout=60_000)  # type: ignore[attr-defined]
    smoothing = page.locator("input[type=number]").first  # type: ignore[attr-defined]
    smoothing.fill("0")  # the windows as logged, not a moving average
    smoothing.press("Enter")
    page.get_by_text("Ignore outliers in chart scaling").click()  # type: ignore[attr-defined]  # whole curves
    time.sleep(2)
    page.reload()  # type: ignore[attr-defined]  # the settings stay (local storage); the axes are fitted anew
    page.wait_for_selector("canvas, svg.line-chart, tf-scalar-card, .chart", timeout=60_000)  # type: ignore[attr-defined]
    time.sleep(6)  # the charts draw after their data arrives
    page.screenshot(path=str(IMAGES / "watch-tensorboard.png"))  # type: ignore[attr-defined]


def main() -> int:
    IMAGES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pitstop-shots-"))
    try:
        args = [
            sys.executable, "-m", "pitstop", "watch", "--window-steps", "40", "--warmup", "5", "--no-history",
            "--report-to", "tensorboard", "--logdir", str(work / "runs"), "--html", str(work / "run.html"),
            "--", *LOOP,
        ]  # fmt: skip
        text = run_in_pty(args)
        if os.environ.get("PITSTOP_SHOTS_RAW"):  # the raw capture, to look at
            Path(os.environ["PITSTOP_SHOTS_RAW"]).write_text(text)
        (IMAGES / "watch-live-panel.txt").write_text(last_panel(text))
        shoot(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("watch-report.png", "watch-tensorboard.png", "watch-live-panel.txt"):
        print(f"{IMAGES / name}: {(IMAGES / name).stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
