# pitstop's zero-code entry point. The runner puts this folder first on PYTHONPATH, so every Python
# process the observed command starts runs it at start-up. It arms the probe (which waits for torch to
# be imported; once, should pitstop's autoload .pth have armed it already), then runs the sitecustomize this file shadows, if the interpreter has one.
import importlib.machinery as _machinery
import importlib.util as _util
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    from pitstop.probe.bootstrap import arm as _arm

    _arm(via="sitecustomize")
except Exception as _exc:  # never take the observed program down
    print(f"pitstop: probe not armed ({type(_exc).__name__}: {_exc})", file=_sys.stderr)

_rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_spec = _machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _shadowed = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)
