"""A cause as one unit: what it means, how the docs describe it, which remedies answer it, and the rule that
finds it, declared once in the cause's own module with ``@cause(...)`` on its rule."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from pitstop.core.findings import Finding
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId
from pitstop.diagnose.context import RuleContext

Rule = Callable[[RuleContext], Finding | None]
# what a rule judges on: every item must be present in the inputs; an item that is a tuple is met by any one of
# its kinds (a rule with two ways to the same fact). Checked against the inputs by ``diagnose/coverage.py``
Need = Evidence | tuple[Evidence, ...]


@dataclass(frozen=True)
class Cause:
    id: CauseId
    title: str  # a finding's heading in every report
    because: str  # what it means, one clause (the causes page, `pitstop causes`)
    needs_gpu: bool  # checked only on a GPU run: a CPU run lists it as not checked
    fires_when: str  # the causes page's "fires when"; {NAME} is filled from the rule module's constants
    estimate: str  # the causes page's "estimate": how the speed-up is worked out and its basis
    remedies: tuple[
        RemedyId, ...
    ]  # every remedy that answers it: a fix names them, tune tries the tunable ones
    rule: Rule  # RuleContext -> Finding | None: pure, never measures
    reads_findings: bool = False  # runs after every other rule and reads their findings (``ctx.earlier``)
    needs: tuple[Need, ...] = ()  # the evidence it judges on: without it, a report lists it as not checked


REGISTRY: dict[CauseId, Cause] = {}  # filled as the cause modules are imported (``pitstop.diagnose.causes``)


def cause(
    cause_id: CauseId,
    *,
    title: str,
    because: str,
    needs_gpu: bool,
    fires_when: str,
    estimate: str,
    remedies: tuple[RemedyId, ...],
    reads_findings: bool = False,
    needs: tuple[Need, ...] = (),
) -> Callable[[Rule], Rule]:
    """Register the decorated rule as the one that finds ``cause_id``, with what the cause means. The rule's
    findings carry the cause's title, whoever calls it (``diagnose``, a test). ``needs``: the evidence the rule
    judges on, so a run without it lists the cause as not checked instead of silently passing it."""

    def register(rule: Rule) -> Rule:
        if cause_id in REGISTRY:
            raise ValueError(f"cause {cause_id} is declared twice: {REGISTRY[cause_id].rule.__module__}")

        @functools.wraps(rule)
        def titled(ctx: RuleContext) -> Finding | None:
            finding = rule(ctx)
            if finding is not None:
                finding.title = title
            return finding

        REGISTRY[cause_id] = Cause(
            cause_id, title, because, needs_gpu, fires_when, estimate, remedies, titled, reads_findings, needs
        )
        return titled

    return register
