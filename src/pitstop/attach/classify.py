"""What a sampled stack was doing: the phase of a training step, the framework that drives the loop, and
whether a process is a DataLoader worker. From function and module names only, so it works on any job.

Backward runs in autograd's C++ engine: on a CPU it runs on the calling thread, below the Python frame of
``loss.backward()`` / ``torch.autograd.backward`` (so the sample still shows that frame); on a GPU the engine
runs in its own threads while the main thread waits inside the same frame. Either way the time inside that
frame is the backward as the loop sees it."""

from __future__ import annotations

from pitstop.attach.stacks import Frame, Stack
from pitstop.core.vocabulary import StrEnum


class Phase(StrEnum):
    """Where a training loop's main thread is; ``OTHER`` is the loop itself, logging, anything unnamed."""

    EVAL = "evaluation"
    SAVE = "saving"
    DATA = "data wait"
    COLLECTIVE = "collectives"
    OPTIMIZER = "optimizer step"
    BACKWARD = "backward"
    FORWARD = "forward"
    OTHER = "other"


# the order phases are looked for: an outer context (evaluation, a save) wins over what it calls
PRECEDENCE = (
    Phase.EVAL,
    Phase.SAVE,
    Phase.DATA,
    Phase.COLLECTIVE,
    Phase.OPTIMIZER,
    Phase.BACKWARD,
    Phase.FORWARD,
)

EVAL_NAMES = {
    "evaluate",
    "evaluation_loop",
    "prediction_step",
    "prediction_loop",
    "validation_step",
    "_run_evaluation",
    "validate",
    "eval_loop",
    "run_eval",
}
SAVE_NAMES = {
    "save",
    "save_pretrained",
    "save_model",
    "_save",
    "_save_checkpoint",
    "save_state",
    "save_checkpoint",
    "save_file",
    "save_16bit_model",
}
COLLECTIVE_NAMES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "monitored_barrier",
}
BACKWARD_FILES = ("torch/_tensor.py", "torch/autograd/__init__.py", "torch/autograd/graph.py")
BACKWARD_OWNERS = ("accelerate/", "lightning/", "pytorch_lightning/", "deepspeed/")


def _short(name: str) -> str:
    """``SGD.step`` -> ``step``; ``f.<locals>.g`` -> ``g``."""
    return name.rsplit(".", 1)[-1]


def _file(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def is_data_wait(frame: Frame) -> bool:
    f, short = _file(frame), _short(frame.name)
    if "torch/utils/data/" in f and short in ("__next__", "_next_data"):
        return True
    return "accelerate/data_loader.py" in f and short == "__iter__"


def is_optimizer_step(frame: Frame) -> bool:
    """Inside an optimizer's ``step`` (torch's wrapper, the optimizer's own step, a framework's wrapper);
    ``zero_grad`` and the LR scheduler are not the step."""
    f, short = _file(frame), _short(frame.name)
    if "lr_scheduler" in f or short == "zero_grad":
        return False
    if "torch/optim/" in f:
        return (
            short in ("step", "wrapper", "_use_grad", "_default_to_fused_or_foreach")
            or short.startswith("_single_tensor_")
            or short.startswith("_multi_tensor_")
            or short.startswith("_fused_")
        )
    if short in ("step", "optimizer_step"):
        return "accelerate/optimizer.py" in f or "deepspeed/" in f or "lightning" in f
    return False


def _phase_of_frame(frame: Frame) -> Phase | None:
    f, short = _file(frame), _short(frame.name)
    if short in EVAL_NAMES:
        return Phase.EVAL
    if short in SAVE_NAMES and (short != "save" or "torch/serialization.py" in f or "safetensors" in f):
        return Phase.SAVE
    if is_data_wait(frame):
        return Phase.DATA
    if "torch/distributed/" in f and short in COLLECTIVE_NAMES:
        return Phase.COLLECTIVE
    if is_optimizer_step(frame) or ("torch/optim/" in f and short == "zero_grad"):
        return Phase.OPTIMIZER
    backward = short in ("backward", "manual_backward", "run_backward", "_engine_run_backward")
    if backward and any(part in f for part in BACKWARD_FILES + BACKWARD_OWNERS):
        return Phase.BACKWARD
    if "torch/nn/modules/module.py" in f and short in ("_call_impl", "_wrapped_call_impl"):
        return Phase.FORWARD
    return None


def classify(stack: Stack) -> Phase:
    """The phase of one sample of a training loop's main thread (``OTHER`` when nothing is recognised)."""
    found = {p for p in map(_phase_of_frame, stack) if p is not None}
    return next((p for p in PRECEDENCE if p in found), Phase.OTHER)


def in_optimizer_step(stack: Stack) -> bool:
    return any(is_optimizer_step(f) for f in stack)


FRAMEWORK_MARKS = (  # the most specific first: TRL runs the Trainer, which runs Accelerate
    ("trl/", "trl"),
    ("transformers/trainer.py", "hf_trainer"),
    ("lightning/", "lightning"),
    ("pytorch_lightning/", "lightning"),
    ("deepspeed/runtime/engine.py", "deepspeed"),
    ("accelerate/accelerator.py", "accelerate"),
    ("accelerate/data_loader.py", "accelerate"),
)


def framework_of(stacks: list[Stack]) -> str | None:
    """The framework that drives the loop, from module paths in the stacks; 'pytorch' for a plain loop that
    shows torch frames, None when no sample shows training at all."""
    files = {_file(f) for stack in stacks for f in stack}
    for mark, name in FRAMEWORK_MARKS:
        if any(mark in f for f in files):
            return name
    return "pytorch" if any("torch/" in f for f in files) else None


def is_worker(stacks: list[Stack]) -> bool:
    """A DataLoader worker process: its main thread runs torch's ``_worker_loop``."""
    return any(
        "torch/utils/data/_utils/worker.py" in _file(f) and _short(f.name) == "_worker_loop"
        for stack in stacks[:50]
        for f in stack
    )


def loader_kind(stacks: list[Stack]) -> str | None:
    """'single' (num_workers=0: batches are made in the loop's own thread) or 'multi', when a sample shows
    which iterator the DataLoader ran."""
    names = {f.name for stack in stacks for f in stack if "torch/utils/data/dataloader.py" in _file(f)}
    if any(n.startswith("_SingleProcessDataLoaderIter") for n in names):
        return "single"
    if any(n.startswith("_MultiProcessingDataLoaderIter") for n in names):
        return "multi"
    return None
