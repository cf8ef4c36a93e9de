"""A tiny training job that does what real jobs do with processes, for pitstop's lifecycle tests.

--setpgid        the job makes itself its group's leader (as some launchers and process managers do)
--job-control    it runs a child in a process group of its own, stops and continues it, and waits for it
--server DIR     it starts a server in a session of its own (setsid) and a daemon (double fork, setsid),
                 writes their PIDs to DIR/server.pid and DIR/daemon.pid, and never ends them itself
--marker FILE    its `finally:` block and an `atexit` handler each append a line to FILE
Each step also appends the step's number to FILE.steps, so a test can wait for the loop to be running.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import subprocess
import sys
from pathlib import Path

SLEEPER = "import time; time.sleep(3600)"
DAEMON = (
    "import os, sys, time\n"
    "if os.fork():\n"
    "    sys.exit(0)\n"  # the intermediate parent leaves at once: the daemon is an orphan
    "os.setsid()\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(3600)\n"
)


def start_servers(folder: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    (folder / "server.pid").write_text(str(server.pid))
    subprocess.run([sys.executable, "-c", DAEMON, str(folder / "daemon.pid")], check=True)


def job_control() -> str:
    """What a shell script with `set -m` does: a child in its own group, stopped and continued."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, time; time.sleep(0.5); print(os.getpgid(0) == os.getpid())"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.setpgid(0, 0),
    )
    os.killpg(child.pid, signal.SIGSTOP)
    os.killpg(child.pid, signal.SIGCONT)
    out, _ = child.communicate(timeout=60)
    return "job control: ok" if child.returncode == 0 and out.strip() == "True" else f"job control: {out!r}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--setpgid", action="store_true")
    p.add_argument("--job-control", action="store_true")
    p.add_argument("--server", type=Path, default=None)
    p.add_argument("--marker", type=Path, default=None)
    args = p.parse_args()
    said: list[str] = []
    if args.setpgid:
        os.setpgid(0, 0)  # PermissionError for a session leader
        said.append(f"setpgid: ok, leads {os.getpgid(0) == os.getpid()}")
    if args.job_control:
        said.append(job_control())
    if args.server is not None:
        start_servers(args.server)
    marker = args.marker
    if marker is not None:
        marker.write_text("".join(line + "\n" for line in said))
        atexit.register(lambda: marker.open("a").write("atexit\n"))

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    try:
        for step in range(args.steps):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if marker is not None:
                with open(f"{marker}.steps", "a") as f:
                    f.write(f"{step}\n")
    finally:
        if marker is not None:
            marker.open("a").write("finally\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
