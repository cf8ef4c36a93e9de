"""Every cause pitstop names, one module each: its id, words, doc prose, remedies and rule (``base.cause``).

Modules here are discovered, not listed: a new cause is a new module. ``CAUSES`` is in ``CauseId`` order (the
order of the causes page and of ``pitstop causes``); ``RULES`` runs them in that order, those that read the
other rules' findings last.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from pitstop.core.vocabulary import CauseId
from pitstop.diagnose.causes.base import REGISTRY, Cause, Rule


def _discover() -> Mapping[CauseId, Cause]:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    undeclared = [c for c in CauseId if c not in REGISTRY]
    if undeclared:  # a CauseId member without its module: a programming error
        raise ImportError(f"no module declares the causes {[str(c) for c in undeclared]}")
    return MappingProxyType({c: REGISTRY[c] for c in CauseId})


CAUSES: Mapping[CauseId, Cause] = _discover()

RULES: tuple[Rule, ...] = tuple(
    c.rule
    for c in sorted(CAUSES.values(), key=lambda c: c.reads_findings)  # sorted() is stable
)

__all__ = ["CAUSES", "RULES", "Cause"]
