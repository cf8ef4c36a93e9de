"""Input-pipeline fixes: packing (and, later, pre-tokenized caches)."""

from pitstop.data.packing import PackingPlan, plan_packing

__all__ = ["PackingPlan", "plan_packing"]
