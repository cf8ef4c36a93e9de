"""`import pitstop` and `pitstop --help` must not pull torch, transformers or pynvml in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "pynvml", "accelerate", "trl", "peft")


def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(','.join(m for m in " + repr(HEAVY) + " if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return {m for m in out.stdout.strip().split(",") if m}


@pytest.mark.slow
def test_import_pitstop_is_light() -> None:
    assert _loaded_after("import pitstop, pitstop.diagnose, pitstop.core.profile, pitstop.hardware") == set()


@pytest.mark.slow
def test_help_is_light() -> None:
    code = (
        "from typer.testing import CliRunner\nfrom pitstop.cli.app import app\n"
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output\n"
        "for c in (['doctor'], ['attach'], ['history'], ['data'], ['data', 'pack']):\n"
        "    r = CliRunner().invoke(app, [*c, '--help']); assert r.exit_code == 0, r.output"
    )
    assert _loaded_after(code) == set()


def test_every_command_is_registered_at_import() -> None:
    """app.py registers every command when it is imported, one way (no argv sniffing, no late mounting):
    the tree a test's CliRunner sees is the one ``pitstop`` runs, in the order --help lists it."""
    import typer

    from pitstop.cli.app import app

    group = typer.main.get_group(app)
    assert list(group.commands) == [
        *("doctor", "watch", "tune", "report", "analyze", "check", "plan", "gpus", "causes", "version"),
        *("attach", "history", "data"),
    ]
    history, data = group.commands["history"], group.commands["data"]
    assert isinstance(history, typer.core.TyperGroup) and isinstance(data, typer.core.TyperGroup)
    assert list(history.commands) == ["list", "show", "compare", "calibration", "check"]
    assert list(data.commands) == ["stats", "cache", "pack"]


@pytest.mark.slow
def test_bootstrap_without_torch_import_stays_light() -> None:
    code = (
        "import os; os.environ['PITSTOP_OUT'] = '/tmp'\nfrom pitstop.probe.bootstrap import arm; assert arm()"
    )
    assert _loaded_after(code) == set()  # armed, but waiting for the program to import torch itself


@pytest.mark.slow
def test_analyze_reads_with_one_blas_thread() -> None:
    """numpy's OpenBLAS starts a spin-waiting thread per core; analyze never calls BLAS, so it asks for one
    (a value the user set is kept)."""
    code = "import numpy, os\nprint(len(os.listdir('/proc/self/task')))"
    # every variable OpenBLAS reads for its pool's size left out (another test may have set one in this worker)
    pools = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS"}
    env = {k: v for k, v in os.environ.items() if k not in pools}

    def threads(prelude: str, extra: dict[str, str] | None = None) -> int:
        out = subprocess.run(
            [sys.executable, "-c", prelude + code],
            capture_output=True,
            text=True,
            check=True,
            env=env | (extra or {}),
        )
        return int(out.stdout)

    if len(os.sched_getaffinity(0)) == 1 or not os.path.isdir("/proc/self/task"):
        pytest.skip("one core, or no /proc: OpenBLAS starts no extra thread to see")
    one = "from pitstop.cli.app import _one_blas_thread\n_one_blas_thread()\n"
    assert threads("") > 1  # what analyze would cost without it
    assert threads(one) == 1
    assert threads(one, {"OPENBLAS_NUM_THREADS": "2"}) == 2
