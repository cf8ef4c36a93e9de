"""The autoload hook: ``pitstop-autoload.pth``, installed in site-packages with the package, imports this module
at interpreter start-up only when PITSTOP_OUT is set (one environment lookup otherwise), so any launcher that
passes the environment on (Ray's raylet, DeepSpeed's launcher through ``.deepspeed_env``, a container started
with ``-e``) carries the probe. The PYTHONPATH folder (``runner.inject``) stays as the fallback for interpreters
where pitstop is not installed; ``bootstrap.arm`` arms once per process whichever fires first.
"""

from __future__ import annotations

import sys

PTH_NAME = "pitstop-autoload.pth"


def run() -> None:
    try:
        from pitstop.probe.bootstrap import arm

        arm(via="pth")
    except Exception as exc:  # never take the observed program down
        print(f"pitstop: probe not armed ({type(exc).__name__}: {exc})", file=sys.stderr)
