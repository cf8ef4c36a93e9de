"""Every rule: a pure function RuleContext -> Finding | None. Order matters only for rules that read
earlier findings (``low_mfu_unexplained`` runs last and stays quiet when a named cause explains the gap)."""

from __future__ import annotations

from collections.abc import Callable

from pitstop.diagnose.context import RuleContext
from pitstop.diagnose.rules.allocator import allocator_thrash
from pitstop.diagnose.rules.checkpoints import checkpoint_stall
from pitstop.diagnose.rules.clocks import gpu_throttled
from pitstop.diagnose.rules.compute import (
    communication_bound,
    host_sync,
    low_mfu_unexplained,
    no_mixed_precision,
    slow_attention,
    small_batch,
)
from pitstop.diagnose.rules.gc_pauses import gc_pauses
from pitstop.diagnose.rules.inputs import dataloader_bound, padding_waste, pageable_copies
from pitstop.diagnose.rules.kernels import unfused_kernels
from pitstop.diagnose.rules.recompute import needless_recompute
from pitstop.diagnose.rules.run import eval_overhead, idle_gpu
from pitstop.diagnose.rules.scale import offload_bound, straggler
from pitstop.diagnose.rules.sharding import oversharded
from pitstop.diagnose.rules.threads import cpu_oversubscribed
from pitstop.findings import Finding

Rule = Callable[[RuleContext], Finding | None]

RULES: tuple[Rule, ...] = (
    dataloader_bound,
    padding_waste,
    slow_attention,
    no_mixed_precision,
    offload_bound,
    small_batch,
    needless_recompute,
    unfused_kernels,
    host_sync,
    pageable_copies,
    allocator_thrash,
    gpu_throttled,
    communication_bound,
    oversharded,
    straggler,
    eval_overhead,
    checkpoint_stall,
    cpu_oversubscribed,
    gc_pauses,
    idle_gpu,
    low_mfu_unexplained,
)
