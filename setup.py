"""Only the build glue pyproject.toml cannot say: put ``pitstop-autoload.pth`` at the top of site-packages,
for a wheel (``build_py``) and for an editable install (``editable_wheel``), as pytest-cov does for its .pth.
Everything else about the package is in pyproject.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).parent / "src" / "pitstop" / "probe" / "_inject" / "pitstop-autoload.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))


class _StrategyWithPth:
    """Wraps setuptools' editable strategy and adds the .pth to the editable wheel it writes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __enter__(self) -> _StrategyWithPth:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self.inner.__exit__(*exc)

    def __call__(self, wheel: Any, files: list[str], mapping: dict[str, str]) -> None:
        self.inner(wheel, files, mapping)
        wheel.writestr(PTH.name, PTH.read_bytes())


class EditableWheelWithPth(editable_wheel):
    def _select_strategy(self, *args: Any, **kwargs: Any) -> Any:
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
