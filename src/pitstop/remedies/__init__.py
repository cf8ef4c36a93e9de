"""Remedies: every change pitstop can advise, defined once (see ``base``).

Rules refer to remedies with parameters from the evidence (``use(RemedyId.WORKERS, workers=4, basis=...)``);
``advise`` turns those references into the Fix a Finding shows; tune walks ``REGISTRY`` for what it can try
and prints the kept change from the same ``advice``. A new remedy is a new module here: modules are discovered,
not listed, and a tunable one says where it stands in tune's order (``tune_rank``).
"""

from __future__ import annotations

import importlib
import pkgutil

from pitstop.core.findings import Fix, Use, use
from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import REGISTRY, Advice, Remedy, TrialFacts

NOT_REMEDIES = ("arming", "autocast", "base")  # the package's machinery, not remedies


def _discover() -> None:
    """Import every remedy module (each registers its remedy), then put the registry in tune's order: the
    ``tune_rank`` of each tunable remedy, then the rest by id."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in NOT_REMEDIES:
            importlib.import_module(f"{__name__}.{module.name}")
    ordered = sorted(REGISTRY.values(), key=lambda r: (r.tune_rank is None, r.tune_rank or 0, str(r.id)))
    REGISTRY.clear()
    REGISTRY.update({r.id: r for r in ordered})


_discover()

__all__ = ["REGISTRY", "Advice", "Remedy", "RemedyId", "TrialFacts", "Use", "advise", "remedy", "use"]


def remedy(remedy_id: RemedyId | str) -> Remedy:
    """The registered remedy; an unknown id is a programming error (KeyError)."""
    return REGISTRY[RemedyId(remedy_id)]


def advise(framework: Framework | str | None, *uses: Use) -> Fix:
    """The Fix a Finding shows: each remedy's advice, in order, for the job's framework and for every
    framework a remedy writes its own snippet for (so a saved report serves whoever reads it)."""
    fw = Framework.of(framework)
    text = " ".join(remedy(u.remedy).advice(fw, u.params).text for u in uses)
    frameworks: list[Framework] = [Framework.PYTORCH]
    for u in uses:
        frameworks += [f for f in remedy(u.remedy).frameworks() if f not in frameworks]
    if fw not in frameworks:
        frameworks.append(fw)
    snippets = {
        str(f): "\n".join(remedy(u.remedy).advice(f, u.params).snippet for u in uses) for f in frameworks
    }
    return Fix(text=text, snippets=snippets, framework=str(fw), uses=tuple(uses))
