"""A launcher that does not pass the environment on: the driver loads Ray (as a Ray job's driver does) and
starts its one worker with a clean environment, so the worker trains unobserved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ray  # noqa: F401  (what marks this driver as a launcher's)
import torch  # noqa: F401  (the driver imports torch, as Ray Train's does)

worker = Path(__file__).with_name("train_plain.py")
subprocess.run([sys.executable, str(worker), "20"], env={"PATH": os.environ.get("PATH", "")}, check=True)
