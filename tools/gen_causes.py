"""Write docs/causes.md from the code that decides: the catalogue (ids, titles, GPU-only or not) and each
rule's module constants (its thresholds and assumptions), so the page cannot drift from what pitstop does.

    python tools/gen_causes.py           # rewrite docs/causes.md
    python tools/gen_causes.py --check   # exit 1 when docs/causes.md is stale (tests/unit/test_docs.py)

The prose under "fires when" and "estimate" is written here, per cause; its thresholds are the rule
module's constants filled in (``{DATA_WAIT_MIN:.0%}``), so a changed constant changes the page. A cause
without prose, or prose for a cause the catalogue does not list, is an error.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "causes.md"
COMMAND = "python tools/gen_causes.py"

# per cause: (fires when, estimated speed-up and its basis); {NAME} is a constant of the rule's module
PROSE: dict[str, tuple[str, str]] = {
    "dataloader_bound": (
        "data wait ≥ {DATA_WAIT_MIN:.0%} of the step (of the rank that waits most); from an nvidia-smi log, "
        "utilization dips under {DIP_UTIL:.0f}% between busy stretches",
        "with the fix's workers (the cores per rank, one kept for the step): each loads a batch in the time one "
        "loader takes now, so a batch arrives every (that time) / workers, and the step becomes the longer of "
        "that and the rest of the step; without the count, at most 1/(1 − data wait share)",
    ),
    "padding_waste": (
        "pad tokens ≥ {PADDING_MIN:.0%} of all tokens",
        "1/(1 − (forward + backward share) × (1 − what packing keeps)): with a dense mask (SDPA, eager) the "
        "rows the batches' examples fill first-fit at the padded width, over today's rows (counted per batch); "
        "with a per-example attention (FlashAttention, flex) the FLOPs left; else the pad share",
    ),
    "slow_attention": (
        "the config says `eager` (or no SDPA call was seen)",
        "under `doctor` and `tune`: one layer's eager and fused (SDPA) attention timed in the job after its "
        "window, on its device at its shapes, forward and backward; the difference × layers × micro-batches "
        "over the step time. Elsewhere (traces, a probe inside your script): attention's FLOPs share at the row "
        "length, eager taken as {EAGER_SLOWDOWN[gpu]:.0f}× (GPU) / {EAGER_SLOWDOWN[cpu]:.0f}× (CPU) slower per FLOP",
    ),
    "no_mixed_precision": (
        "matmuls in fp32 or TF32 on a tensor-core GPU",
        "compute share × min(peak ratio, 3× fp32 / 2× TF32)",
    ),
    "offload_bound": (
        "optimizer or parameter offload in the DeepSpeed / FSDP config",
        "PCIe bytes per step at 80% of the link, or the host optimizer time; high when the model states fit "
        "under {GPU_MEMORY_USABLE:.0%} of the GPU without offload",
    ),
    "small_batch": (
        "utilization < 75% while the job computes (per GPU, mean over the GPUs that worked; a trace's "
        "kernel-busy share without samples), memory headroom, not explained by data wait; or SM activity "
        "under {SM_FULL:.0%} from the activity counters",
        "at most 1/utilization",
    ),
    "host_sync": (
        "≥ 1 blocking host sync per step while the GPU idles",
        "bounded by the idle share",
    ),
    "pageable_copies": (
        "`pin_memory=False` for batches copied to the GPU",
        "bytes per step at pageable vs pinned PCIe rates",
    ),
    "eval_overhead": (
        "Trainer-logged evaluation ≥ {EVAL_MIN:.0%} of the run; or GPU samples that pause at regular "
        "intervals for ≥ {EVAL_MIN:.0%} of the time the job ran",
        "80% of that time saved",
    ),
    "idle_gpu": (
        "a GPU of the samples never works (peak ≤ 2%) while another computes ≥ 20% busy",
        "GPUs / busy GPUs",
    ),
    "straggler": (
        "the other ranks wait ≥ 5% of a step at collectives for the last rank to arrive (timed collectives "
        "live, or aligned traces); without them, one rank's data wait exceeds the median rank's by ≥ 5% of a "
        "step",
        "1/(1 − the others' waiting share)",
    ),
    "needless_recompute": (
        "activation checkpointing on while the planner says the run fits without it under "
        "{FIT_SHARE:.0%} of the GPU (or a CPU run, or < 50% GPU memory used)",
        "recompute ≈ measured backward − {BACKWARD_PER_FORWARD:.0f} × forward of the checkpointed step "
        "(the ratio assumed, so confidence is lowered), at most the forward and a third of the backward",
    ),
    "oversharded": (
        "ZeRO-3 / FSDP `FULL_SHARD` (or `HYBRID_SHARD`) on ≥ 2 GPUs while the planner says ZeRO-2 / "
        "`SHARD_GRAD_OP` (`HYBRID_SHARD_ZERO2`) fits under {FIT_SHARE:.0%} of the GPU (model states under "
        "{STATES_SHARE:.0%} when the shape is unknown); or `FULL_SHARD` across nodes without `HYBRID_SHARD` "
        "/ ZeRO++ hpZ while the hybrid fits",
        "plan/comm's extra communication seconds per step at 80% of the links, over the measured step (at "
        "most half of it, or the measured exposed communication when collectives were timed) or the planned one",
    ),
    "low_mfu_unexplained": (
        "GPU ≥ 85% busy, MFU < 60% of the low end of 40–50%, no high finding",
        "to the low end of the range",
    ),
    "communication_bound": (
        "ranks sit blocked ≥ 5% of a step while data moves after the last rank arrived (timed collectives "
        "live); from traces, NCCL time not overlapping compute",
        "1/(1 − exposed share); bus bandwidth set against the link",
    ),
    "checkpoint_stall": (
        "timed `torch.save` / `save_pretrained` / Trainer / Lightning / Accelerate saves ≥ {SAVE_MIN:.0%} of "
        "the window; offline: saves counted from `save_steps`",
        "saved share × (1 − old/new interval); offline an estimate: the checkpoint's bytes at an assumed "
        "{ASSUMED_WRITE_GBPS:.0f} GB/s",
    ),
    "cpu_oversubscribed": (
        "ranks × (torch threads + busy DataLoader workers) > {MARGIN} × the cores allowed (affinity, cgroup "
        "quota); the job's runnable threads sampled from `/proc`",
        "not estimated (depends on the step's CPU work; `tune` measures the fix)",
    ),
    "unfused_kernels": (
        "vocabulary ≥ {LARGE_VOCAB:,} without a fused linear-cross-entropy; Adam/AdamW/SGD without `fused` on "
        "CUDA; Liger installed but not applied",
        "loss: the planner's logits bytes ×{TRAFFIC_PASSES:.0f} at {BW_EFFICIENCY:.0%} of memory bandwidth over "
        "the step (estimate); optimizer: measured share × assumed ×{LOOP_TO_FUSED:.0f} (for-loop) / "
        "×{FOREACH_TO_FUSED} (foreach)",
    ),
    "allocator_thrash": (
        "`torch.cuda.memory_stats` over the window: allocation retries, cudaMalloc in ≥ {CHURN_STEPS:.0%} of "
        "the steps with cudaFree, or reserved ≥ {FRAGMENTED} × allocated near full memory "
        "(≥ {NEAR_FULL:.0%} reserved)",
        "counters × assumed {ASSUMED_DRIVER_CALL_S_MS:.0f} ms per cudaMalloc / cudaFree and "
        "{ASSUMED_RETRY_S_MS:.0f} ms per retry",
    ),
    "gc_pauses": (
        "Python's garbage collector, timed per generation by a `gc.callbacks` callback during the window, takes "
        "≥ {GC_MIN:.0%} of the step time (of the rank that loses most); high from {FULL_HIGH:.0%} in full "
        "(generation-2) collections the fix would remove",
        "1/(1 − what the fix removes): `gc.freeze()` after setup, `gc.disable()` and a full `gc.collect()` every "
        "N steps take the survivors' traversal out of the full collections; finding and freeing the garbage they "
        "found stays (each found object costing {FOUND_COST:.0f}× a survivor, the tracked objects counted after "
        "the window), and so does the young generations' time. Without the count, the full collections' whole "
        "time, an upper bound. `gc.freeze()` alone shortens each full collection, but CPython then runs them "
        "more often",
    ),
    "gpu_throttled": (
        "NVML clock-event reasons (power cap, thermal, HW slowdown) in ≥ {THROTTLED_SHARE:.0%} of busy samples "
        "with the SM clock ≤ {SLOW_CLOCK:.0%} of the application clock, per GPU",
        "compute share × application clock / measured clock",
    ),
}


@dataclass(frozen=True)
class Constant:
    name: str
    source: str  # the value as written in the module
    comment: str


def _module_constants(module: ModuleType) -> dict[str, Constant]:
    """Module-level UPPER_CASE assignments with literal values, as written, with their line comments."""
    text = inspect.getsource(module)
    lines = text.splitlines()
    found: dict[str, Constant] = {}
    for node in ast.parse(text).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if not isinstance(target, ast.Name) or not target.id.isupper() or value is None:
            continue
        try:
            ast.literal_eval(value)
        except ValueError:
            continue
        source = " ".join((ast.get_source_segment(text, value) or "").split())
        last = lines[(node.end_lineno or node.lineno) - 1]
        comment = last.split("  # ", 1)[1].strip() if "  # " in last else ""
        found[target.id] = Constant(target.id, source, comment)
    return found


def _functions(module: ModuleType) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(module))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _reached(name: str, functions: dict[str, ast.FunctionDef]) -> list[ast.FunctionDef]:
    """The rule's function and every function of its module it calls, directly or through others."""
    seen: dict[str, ast.FunctionDef] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in functions:
            continue
        seen[current] = functions[current]
        todo.extend(n.id for n in ast.walk(functions[current]) if isinstance(n, ast.Name))
    return list(seen.values())


def _names(nodes: Iterable[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _remedies(nodes: Iterable[ast.AST]) -> list[str]:
    remedy_id = _remedy_enum()
    found = {
        str(getattr(remedy_id, n.attr))
        for node in nodes
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "RemedyId"
        and hasattr(remedy_id, n.attr)
    }
    return sorted(found)


def _remedy_enum() -> Any:
    import pitstop.vocabulary as vocabulary

    if hasattr(vocabulary, "RemedyId"):
        return vocabulary.RemedyId
    import pitstop.remedies as remedies

    return remedies.RemedyId


def _fill(template: str, constants: dict[str, Constant]) -> str:
    values: dict[str, Any] = {c.name: ast.literal_eval(c.source.replace("_", "")) for c in constants.values()}
    for name in ("ASSUMED_DRIVER_CALL_S", "ASSUMED_RETRY_S"):
        if name in values:
            values[f"{name}_MS"] = values[name] * 1000.0  # seconds, said in ms
    if "ASSUMED_WRITE_BPS" in values:
        values["ASSUMED_WRITE_GBPS"] = values["ASSUMED_WRITE_BPS"] / 1e9  # bytes/s, said in GB/s
    return template.format_map(values)


def _rules() -> dict[str, Callable[..., Any]]:
    from pitstop.diagnose.rules import RULES

    return {inspect.unwrap(rule).__name__: inspect.unwrap(rule) for rule in RULES}


def _section(cause: Any, rule: Callable[..., Any] | None) -> list[str]:
    cid = str(cause.id)
    gpu = " (GPU only)" if cause.needs_gpu else ""
    out = [f"## `{cid}`", "", f"**{cause.title}**{gpu}: {cause.because}.", ""]
    if rule is None:
        return [*out, "No rule raises it yet.", ""]
    module = sys.modules[rule.__module__]
    constants = _module_constants(module)
    when, estimate = PROSE[cid]
    out += [f"* **Fires when**: {_fill(when, constants)}.", f"* **Estimate**: {_fill(estimate, constants)}."]
    reached = _reached(rule.__name__, _functions(module))
    fixes = _remedies(reached)
    if fixes:
        out.append("* **Fixes** (remedies): " + ", ".join(f"`{f}`" for f in fixes) + ".")
    path = Path(inspect.getsourcefile(rule) or "").resolve().relative_to(ROOT)
    out.append(f"* **Rule**: `{rule.__name__}` in `{path.as_posix()}`.")
    used = [constants[n] for n in sorted(_names(reached)) if n in constants]
    if used:
        out += ["", "| constant | value | what it is |", "| --- | --- | --- |"]
        out += [f"| `{c.name}` | `{c.source}` | {c.comment} |" for c in used]
    return [*out, ""]


def render() -> str:
    """The whole page, from the catalogue and the rules as they are now."""
    from pitstop.catalogue import CAUSES

    causes = list(CAUSES.values())
    ids = {str(c.id) for c in causes}
    if set(PROSE) != ids:
        missing, extra = sorted(ids - set(PROSE)), sorted(set(PROSE) - ids)
        raise SystemExit(f"gen_causes: prose missing for {missing}, prose for unknown causes {extra}")
    rules = _rules()
    head = [
        "# The cause catalogue",
        "",
        f"<!-- Generated by `{COMMAND}` from src/pitstop/catalogue.py and src/pitstop/diagnose/rules/. "
        "Do not edit: change the code or the generator, then run it again. -->",
        "",
        f"Generated by `{COMMAND}` from the catalogue (`src/pitstop/catalogue.py`) and the rules' constants "
        "(`src/pitstop/diagnose/rules/`); `tests/unit/test_docs.py` fails when this page is stale. "
        "A cause id, once released, keeps its meaning in the JSON. `pitstop causes` lists them too.",
        "",
        "GPU only: a cause checked only on a GPU run; a CPU run lists those as not checked. How findings are "
        "ranked and how severity follows confidence: [How it measures](how-it-measures.md#order-and-severity).",
        "",
        "| id | title | GPU only |",
        "| --- | --- | --- |",
    ]
    head += [f"| [`{c.id!s}`](#{c.id!s}) | {c.title} | {'yes' if c.needs_gpu else ''} |" for c in causes]
    body: list[str] = []
    for c in causes:
        body += _section(c, rules.get(str(c.id)))
    return "\n".join([*head, "", *body]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/causes.md from the catalogue and the rules.")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale, write nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="the page (default: docs/causes.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
