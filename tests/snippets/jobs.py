"""Running a snippet for real: inside a tiny job of its framework (a random-weight Llama, or a Mixtral for the
experts remedies, on CPU), then a few steps of that job with whatever the snippet changed.

The snippet's placeholders are filled mechanically: ``F(..., k=v)`` gets the job's own arguments for ``F``
(``TrainingArguments``' output_dir and max_steps, ``Trainer``'s model and dataset, ``DataLoader``'s dataset and
collate, ...) under the snippet's; a ``...`` statement becomes the job's step; ``"cuda"`` becomes ``"cpu"``; a
bare ``L.Trainer(...)`` or callback is the one the job uses. A statement that cannot run on this CPU machine
(fp16, TF32, a GPU accelerator, vLLM, a multi-node mesh) is named with its reason and left to the static
check; everything else runs.
"""

from __future__ import annotations

import ast
import copy
import gc
import inspect
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.core.vocabulary import Framework
from tests.cache_inputs import number_rows
from tests.snippets.harness import (
    LIBRARY,
    OPTIONAL_PACKAGES,
    PLACEHOLDER_NAMES,
    Report,
    bound_names,
    free_names,
    load,
    parse_json_fragment,
    segments,
)

STEPS = 2  # optimizer steps each job runs after the snippet
VOCAB_WORDS = [f"w{k}" for k in range(40)]


class NotOnCpu(Exception):
    """The snippet's statement needs what this machine lacks."""


# keyword=value pairs that need a GPU (or minutes of compiling): the statement is checked, not run
GPU_KEYWORDS: dict[str, Callable[[Any], str | None]] = {
    "fp16": lambda v: "fp16 mixed precision needs a GPU" if v is True else None,
    "tf32": lambda v: "TF32 needs an Ampere GPU" if v is True else None,
    "torch_compile": lambda v: "torch.compile takes minutes on a 2-core CPU" if v is True else None,
    "use_liger_kernel": lambda v: OPTIONAL_PACKAGES["liger_kernel"] if v is True else None,
    "fsdp": lambda v: "FSDP through the Trainer needs a distributed GPU launch" if v else None,
    "mixed_precision": lambda v: "fp16 mixed precision needs a GPU" if v == "fp16" else None,
    "precision": lambda v: (
        "16-bit float mixed precision needs a GPU" if v in ("16-mixed", "fp16-mixed") else None
    ),
    "accelerator": lambda v: "the snippet picks GPUs" if v in ("gpu", "cuda") else None,
    "strategy": lambda v: (
        "Lightning's DeepSpeed strategies need CUDA" if str(v).startswith("deepspeed") else None
    ),
    "use_vllm": lambda v: OPTIONAL_PACKAGES["vllm"] if v is True else None,
    "dynamo_plugin": lambda v: "torch.compile takes minutes on a 2-core CPU",
    "zero_quantized_weights": lambda v: "ZeRO++ quantization kernels need a GPU" if v else None,
}
GPU_CALLS = {
    "torch.compile": "torch.compile takes minutes on a 2-core CPU",
    "FSDP": "FSDP needs an accelerator device (torch: no CPU-only FSDP)",
    "FullyShardedDataParallel": "FSDP needs an accelerator device (torch: no CPU-only FSDP)",
    "fully_shard": "FSDP needs an accelerator device (torch: no CPU-only FSDP)",
    "init_device_mesh": "a 2-D device mesh needs nodes × GPUs ranks, not one CPU process",
    "FSDPStrategy": "Lightning's FSDP strategy needs GPUs",
    "grouped_mm": "torch's grouped_mm kernel runs on CUDA",
}


GPU_ATTRIBUTES = {"bf16_compress_hook": "torch's bf16 compression hook needs NCCL on CUDA"}


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return object()


def cpu_only_reason(stmt: ast.stmt, optional_names: set[str]) -> str | None:
    """Why this simple statement cannot run on the CPU test machine (None: it runs)."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.keyword) and node.arg in GPU_KEYWORDS:
            reason = GPU_KEYWORDS[node.arg](_literal(node.value))
            if reason:
                return reason
        if isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            for name, reason in GPU_CALLS.items():
                if callee == name or callee.endswith("." + name):
                    return reason
            if callee.endswith("init_process_group") and node.args and _literal(node.args[0]) == "nccl":
                return "NCCL needs GPUs"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OPTIONAL_PACKAGES:
            return OPTIONAL_PACKAGES[(node.module or "").split(".")[0]]
        if isinstance(node, ast.Name) and node.id in optional_names:
            return f"{node.id} comes from a package this machine lacks or a statement that needs a GPU"
        if isinstance(node, ast.Attribute) and node.attr in GPU_ATTRIBUTES:
            return GPU_ATTRIBUTES[node.attr]
    return None


def _is_ellipsis(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


class Filler(ast.NodeTransformer):
    """Fills a snippet's placeholders with the job's own pieces and sets aside what cannot run on CPU."""

    def __init__(self, step: list[ast.stmt], optional_names: set[str]) -> None:
        self.step = step
        self.optional_names = optional_names
        self.not_run: list[str] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        elided = [k for k in node.keywords if k.arg and _is_ellipsis(k.value)]
        if any(_is_ellipsis(a) for a in node.args) or elided:
            node.args = [a for a in node.args if not _is_ellipsis(a)]
            node.keywords = [k for k in node.keywords if k not in elided]
            explicit = ast.Tuple([ast.Constant(k.arg) for k in node.keywords if k.arg], ast.Load())
            fill = ast.Call(
                ast.Name("__fill__", ast.Load()),
                [copy.deepcopy(node.func), ast.Constant(len(node.args)), explicit],
                [],
            )
            node.keywords.append(ast.keyword(arg=None, value=fill))
        # a GPU placement: DDP's device_ids / output_device only take CUDA devices
        node.keywords = [k for k in node.keywords if k.arg not in ("device_ids", "output_device")]
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant("cpu") if node.value == "cuda" else node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            if isinstance(stmt, ast.Expr) and _is_ellipsis(stmt.value):
                out += copy.deepcopy(self.step)
                continue
            compound = isinstance(
                stmt, (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef, ast.ClassDef, ast.Try)
            )
            reason = None if compound else cpu_only_reason(stmt, self.optional_names)
            if reason:
                self.not_run.append(f"{ast.unparse(stmt)[:120]}  ({reason})")
                self.optional_names |= bound_names(stmt) - {"model"}  # what it would have set is unset
                out.append(ast.Pass())
                continue
            if compound:
                for name in ("body", "orelse", "finalbody"):
                    if getattr(stmt, name, None):
                        setattr(stmt, name, self._statements(getattr(stmt, name)) or [ast.Pass()])
                stmt = self._visit_compound(stmt)
            else:
                stmt = self.visit(stmt)
            out.append(stmt)
        return out

    def _visit_compound(self, stmt: ast.stmt) -> ast.stmt:
        for name in ("iter", "test", "items", "decorator_list", "bases", "args"):
            value = getattr(stmt, name, None)
            if isinstance(value, ast.AST):
                setattr(stmt, name, self.visit(value))
            elif isinstance(value, list):
                setattr(stmt, name, [self.visit(v) for v in value])
        return stmt

    def fill(self, tree: ast.Module) -> ast.Module:
        body = self._statements(tree.body)
        if "loss" in free_names(
            tree
        ):  # the loss the snippet's lines use comes from the model as they left it
            refreshed: list[ast.stmt] = []
            for stmt in body:
                refreshed.append(stmt)
                if "model" in bound_names(stmt) and not isinstance(stmt, ast.Pass):
                    refreshed += ast.parse("loss = model(**batch).loss").body
            body = refreshed
        # a bare top-level call builds something the job uses (a Trainer, a callback, kwargs for Accelerator)
        body = [
            ast.Expr(ast.Call(ast.Name("__bare__", ast.Load()), [s.value], []))
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
            else s
            for s in body
        ]
        return ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))


@dataclass
class Outcome:
    """What running one snippet did."""

    ran: list[str] = field(default_factory=list)  # the parts that ran
    not_run: list[str] = field(default_factory=list)  # statements left to the static check, with why
    steps: int = 0  # the job's optimizer steps after the snippet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- the tiny jobs' shared pieces


@dataclass
class Pieces:
    """What every framework's tiny job is built from (once per test module)."""

    root: Path
    tokenizer: Any
    models: dict[str, Path]  # kind -> a saved tiny model folder ("llama", "mixtral")
    rows: list[list[int]]

    def model(self, kind: str = "llama") -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.models[kind])

    def train(self) -> list[dict[str, list[int]]]:
        return [{"input_ids": r, "attention_mask": [1] * len(r)} for r in self.rows]


def build_pieces(root: Path) -> Pieces:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        PreTrainedTokenizerFast,
    )

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: k + 3 for k, w in enumerate(VOCAB_WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )
    torch.manual_seed(0)
    small: dict[str, Any] = dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    folders = {}
    for kind, model in (
        ("llama", LlamaForCausalLM(LlamaConfig(**small))),
        ("mixtral", MixtralForCausalLM(MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2))),
    ):
        folders[kind] = root / kind
        model.save_pretrained(folders[kind])
        tokenizer.save_pretrained(folders[kind])
    rows = [[3 + (k * 7 + j) % len(VOCAB_WORDS) for j in range(6 + k % 9)] + [2] for k in range(16)]
    # the files a snippet names by placeholder paths ("train.jsonl", tokenizer="tok.json"): the job's own
    work = root / "work"
    work.mkdir()
    (work / "tok.json").write_text(tok.to_str())
    (work / "train.jsonl").write_text(number_rows(16))
    return Pieces(root, tokenizer, folders, rows)


class PadCollate:
    """The job's own collate: pads ``input_ids`` (lists or arrays) to the batch's longest, ``labels`` (given,
    else the ids) with -100; what a causal-LM loop writes by hand."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        longest = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), longest), self.pad_id)
        labels = torch.full((len(rows), longest), -100)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for k, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[k, :n] = torch.as_tensor(row["input_ids"])
            labels[k, :n] = torch.as_tensor(row.get("labels", row["input_ids"]))
            mask[k, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def model_code_names() -> dict[str, Any]:
    """The tensors and modules a snippet written inside the model's own forward names."""
    import torch

    d, experts, top_k, inter, tokens = 16, PLACEHOLDER_NAMES["E"], 1, PLACEHOLDER_NAMES["I"], 6
    return {
        "query": torch.randn(2, 5, d),
        "key": torch.randn(2, 5, d),
        "value": torch.randn(2, 5, d),
        "mask": None,
        "q": torch.randn(2, 2, 5, 8),
        "k": torch.randn(2, 2, 5, 8),
        "v": torch.randn(2, 2, 5, 8),
        "x": torch.randn(tokens, d, requires_grad=True),
        "expert_ids": torch.randint(0, experts, (tokens * top_k,)),
        "top_k": top_k,
        "w_up": torch.randn(experts, 2 * inter, d),
        "w_down": torch.randn(experts, d, inter),
        "act": torch.nn.functional.silu,
        "block": torch.nn.Linear(d, d),
        "layer": torch.nn.Linear(d, d),
        "Block": torch.nn.Linear,
        "inputs": (torch.randn(tokens, d, requires_grad=True),),
    }


def raw_texts() -> Any:
    """The job's untokenized examples (a datasets.Dataset of text)."""
    from datasets import Dataset

    return Dataset.from_dict({"text": [" ".join(VOCAB_WORDS[k : k + 3 + k % 5]) for k in range(16)]})


def library_names() -> dict[str, Any]:
    return {name: load(spec) for name, spec in LIBRARY.items()}


# ---------------------------------------------------------------- running one snippet in one job


class Job:
    """One framework's tiny job: the names a snippet sees, the arguments ``...`` stands for, and the steps."""

    framework: Framework
    step_code = "loss = model(**batch).loss\nloss.backward()\nopt.step()\nopt.zero_grad()"

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces

    def namespace(self, model_kind: str, source: str) -> dict[str, Any]:
        import torch
        from torch.utils.data import DataLoader

        model = self.pieces.model(model_kind)
        train = self.pieces.train()
        collate = PadCollate(self.pieces.tokenizer.pad_token_id)
        loader: Any = DataLoader(train, batch_size=2, collate_fn=collate)  # type: ignore[arg-type]
        batch = next(iter(loader))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ns: dict[str, Any] = {
            **library_names(),
            **PLACEHOLDER_NAMES,
            **model_code_names(),
            "model": model,
            "name": str(self.pieces.models[model_kind]),
            "model_path": str(self.pieces.models[model_kind]),
            "tokenizer": self.pieces.tokenizer,
            "train": train,
            "dataset": train,
            "collate": collate,
            "loader": loader,
            "opt": opt,
            "optimizer": opt,
            "batch": batch,
            "running": torch.zeros(()),
            "step": 0,
            "i": 0,
            "accum": 2,
            "rows": [r[:-1] for r in self.pieces.rows[:2]],
            "lengths": [len(r) for r in self.pieces.rows],
            "log": lambda *a, **k: None,
            "evaluate": lambda: None,
            "device": "cpu",
            "local_rank": 0,
            "world_size": 1,
            "path": str(self.pieces.root / "checkpoint"),
            "state_dict": {"model": model.state_dict()},
            "prompts": ["w1 w2", "w3"],
            "raw": raw_texts(),
            "tokenize": lambda rows: self.pieces.tokenizer(rows["text"]),
            "num_generations": 2,
            "max_new_tokens": 4,
            "__bare_values__": [],
        }
        attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        ns["self"] = type("OwnBlock", (torch.nn.Module,), {})()
        ns["self"].attn = attn
        return ns

    def bases(self, ns: dict[str, Any]) -> dict[Any, Callable[[], dict[str, Any]]]:
        """The job's own arguments for each callable a snippet elides with ``...``."""
        from torch.utils.data import DataLoader

        return {
            DataLoader: lambda: {"dataset": ns["train"], "batch_size": 2, "collate_fn": ns["collate"]},
            load("torch.nn.parallel:DistributedDataParallel"): lambda: {"module": ns["model"]},
            load("transformers:AutoModelForCausalLM").from_pretrained: lambda: {
                "pretrained_model_name_or_path": ns["name"]
            },
            load("torch.optim:AdamW"): lambda: {"params": ns["model"].parameters(), "lr": 1e-4},
        }

    def prepare(self, ns: dict[str, Any], source: str) -> None:
        """Before the snippet: what its own lines assume of the job."""

    def first_loss(self, ns: dict[str, Any]) -> Any:
        """The loss of the step the snippet is written into (``loss.backward()`` in its lines)."""
        return ns["model"](**ns["batch"]).loss

    def finish(self, ns: dict[str, Any], assigned: set[str]) -> int:
        """The job's steps with what the snippet changed; returns the optimizer steps done."""
        model, loader = ns["model"], ns["loader"]
        opt = ns["opt"] if "opt" in assigned else load("torch.optim:AdamW")(model.parameters(), lr=1e-4)
        steps = 0
        model.train()
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps == STEPS:
                break
        return steps

    def run(self, source: str, model_kind: str = "llama") -> Outcome:
        outcome = Outcome()
        tree = ast.parse(source)
        optional = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in OPTIONAL_PACKAGES
            for a in n.names
        }
        filler = Filler(ast.parse(self.step_code).body, optional)
        filled = filler.fill(tree)
        outcome.not_run = filler.not_run
        ns = self.namespace(model_kind, source)
        self.prepare(ns, source)
        ns["loss"] = self.first_loss(ns)
        bases = self.bases(ns)

        def __fill__(func: Any, positional: int, explicit: tuple[str, ...]) -> dict[str, Any]:
            key = getattr(func, "__func__", func)
            found = next((make for f, make in bases.items() if getattr(f, "__func__", f) is key), None)
            if found is None:
                raise AssertionError(f"the harness has no job arguments for {func!r}: add them to bases()")
            params = [p for p in inspect.signature(func).parameters if p != "self"]
            given = set(params[:positional]) | set(explicit)
            return {k: v for k, v in found().items() if k not in given}

        ns["__fill__"] = __fill__
        ns["__attributes__"] = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        ns["__bare__"] = ns["__bare_values__"].append
        code = compile(filled, f"<{self.framework} snippet>", "exec")
        self.execute(code, ns, filled)
        outcome.ran.append(ast.unparse(filled))
        outcome.steps = self.finish(ns, bound_names(tree))
        return outcome

    def execute(self, code: Any, ns: dict[str, Any], tree: ast.Module) -> None:
        exec(code, ns)


class PytorchJob(Job):
    framework = Framework.PYTORCH

    def prepare(self, ns: dict[str, Any], source: str) -> None:
        """A snippet that syncs a DDP model (no_sync, a comm hook) gets the job's model wrapped in DDP."""
        tree = ast.parse(source)
        syncs = {"no_sync", "register_comm_hook"} & {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
        }
        if syncs and "model" not in bound_names(tree):
            ns["model"] = load("torch.nn.parallel:DistributedDataParallel")(ns["model"])


class HfTrainerJob(Job):
    framework = Framework.HF_TRAINER
    args_class = "transformers:TrainingArguments"
    trainer_class = "transformers:Trainer"

    def args_base(self) -> dict[str, Any]:
        return {
            "output_dir": str(self.pieces.root / f"out-{self.framework}"),
            "max_steps": STEPS,
            "per_device_train_batch_size": 2,
            "report_to": "none",
            "save_strategy": "no",
            "logging_steps": 1,
            "use_cpu": True,
            "disable_tqdm": True,
        }

    def namespace(self, model_kind: str, source: str) -> dict[str, Any]:
        ns = super().namespace(model_kind, source)
        args = load(self.args_class)(**self.args_base())
        ns.update(args=args, config=args, __base_args__=args)
        return ns

    def trainer_base(self, ns: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": ns["model"],
            "args": self.current_args(ns),
            "train_dataset": ns["train"],
            "data_collator": ns["collate"],
        }

    def current_args(self, ns: dict[str, Any]) -> Any:
        """The arguments the snippet built (as ``args`` or ``config``), else the job's."""
        for name in ("args", "config"):
            if ns[name] is not ns["__base_args__"]:
                return ns[name]
        return ns["__base_args__"]

    def bases(self, ns: dict[str, Any]) -> dict[Any, Callable[[], dict[str, Any]]]:
        return {
            **super().bases(ns),
            load(self.args_class): self.args_base,
            load("trl:GRPOConfig"): self.args_base,
            load(self.trainer_class): lambda: self.trainer_base(ns),
        }

    def finish(self, ns: dict[str, Any], assigned: set[str]) -> int:
        trainer_class = load(self.trainer_class)
        trainers = [v for v in [ns.get("trainer"), *ns["__bare_values__"]] if isinstance(v, trainer_class)]
        trainer = trainers[-1] if trainers else trainer_class(**self.trainer_base(ns))
        trainer.train()
        return int(trainer.state.global_step)


class TrlJob(HfTrainerJob):
    framework = Framework.TRL
    args_class = "trl:SFTConfig"
    trainer_class = "trl:SFTTrainer"

    def args_base(self) -> dict[str, Any]:
        return {**super().args_base(), "max_length": 32, "dataset_num_proc": None}

    def trainer_base(self, ns: dict[str, Any]) -> dict[str, Any]:
        from datasets import Dataset

        model_set = ns["model"] is not ns["__job_model__"]  # the snippet loaded or wrapped one
        return {
            "model": ns["model"] if model_set else ns["name"],
            "args": self.current_args(ns),
            "train_dataset": Dataset.from_list([{"input_ids": r} for r in self.pieces.rows]),
            "processing_class": self.pieces.tokenizer,
        }

    def namespace(self, model_kind: str, source: str) -> dict[str, Any]:
        ns = super().namespace(model_kind, source)
        ns["__job_model__"] = ns["model"]
        return ns


class AccelerateJob(Job):
    framework = Framework.ACCELERATE
    step_code = "loss = model(**batch).loss\naccelerator.backward(loss)\nopt.step()\nopt.zero_grad()"

    def namespace(self, model_kind: str, source: str) -> dict[str, Any]:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        ns = super().namespace(model_kind, source)
        # a script has one Accelerator: a snippet that builds one replaces the job's line that did
        builds = any(
            isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == "Accelerator"
            for n in ast.walk(ast.parse(source))
        )
        ns["accelerator"] = None if builds else load("accelerate:Accelerator")(cpu=True)
        ns["__job_accelerator__"] = ns["accelerator"]
        return ns

    def bases(self, ns: dict[str, Any]) -> dict[Any, Callable[[], dict[str, Any]]]:
        return {**super().bases(ns), load("accelerate:Accelerator"): lambda: {"cpu": True}}

    def finish(self, ns: dict[str, Any], assigned: set[str]) -> int:
        from accelerate.state import AcceleratorState, GradientState

        accelerator = ns["accelerator"]
        handlers = [v for v in ns["__bare_values__"] if type(v).__name__.endswith("Kwargs")]
        if accelerator is None or (handlers and accelerator is ns["__job_accelerator__"]):
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
            accelerator = load("accelerate:Accelerator")(cpu=True, kwargs_handlers=handlers)
        model, loader = ns["model"], ns["loader"]
        opt = ns["optimizer"] if "optimizer" in assigned else ns["opt"]
        if "prepare" not in ns["__attributes__"]:  # the snippet did not prepare them itself
            model, opt, loader = accelerator.prepare(model, opt, loader)
        steps = 0
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            steps += 1
            if steps == STEPS:
                break
        return steps


class LightningJob(Job):
    framework = Framework.LIGHTNING
    step_code = "pass"

    def namespace(self, model_kind: str, source: str) -> dict[str, Any]:
        import lightning as L
        import torch

        ns = super().namespace(model_kind, source)
        hf_model = ns["model"]

        class TinyModule(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = hf_model
                if ".attn" in source:  # the module's own attention a snippet calls (else DDP finds it unused)
                    self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
                self.in_step: Callable[[dict[str, Any]], None] | None = None

            def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
                loss = self.model(**batch).loss
                if self.in_step is not None:
                    run, self.in_step = self.in_step, None
                    run({"self": self, "loss": loss, "batch": batch, "batch_idx": batch_idx})
                return loss

            def configure_optimizers(self) -> Any:
                return torch.optim.AdamW(self.parameters(), lr=1e-4)

        module = TinyModule()
        ns.update(model=module, __module__=module, __hf_model__=hf_model)
        ns.pop("self")  # only inside the module's hooks
        return ns

    def first_loss(self, ns: dict[str, Any]) -> Any:
        return ns["__hf_model__"](**ns["batch"]).loss

    def trainer_base(self, ns: dict[str, Any]) -> dict[str, Any]:
        import lightning as L

        return {
            "max_steps": STEPS,
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(self.pieces.root / "lightning"),
            "callbacks": [v for v in ns["__bare_values__"] if isinstance(v, L.Callback)],
        }

    def bases(self, ns: dict[str, Any]) -> dict[Any, Callable[[], dict[str, Any]]]:
        return {**super().bases(ns), load("lightning:Trainer"): lambda: self.trainer_base(ns)}

    def execute(self, code: Any, ns: dict[str, Any], tree: ast.Module) -> None:
        """A snippet that uses ``self`` runs inside training_step; a ``def hook(self, ...)`` becomes the
        module's hook."""
        if "self" in free_names(tree):
            module = ns["__module__"]

            def in_step(local: dict[str, Any]) -> None:
                ns.update(local)
                exec(code, ns)
                ns["__ran_in_step__"] = True

            module.in_step = in_step
            return
        exec(code, ns)
        module = ns["__module__"]
        hooks = {
            name: fn
            for name, fn in ns.items()
            if inspect.isfunction(fn)
            and fn.__code__.co_filename.startswith("<")
            and list(inspect.signature(fn).parameters)[:1] == ["self"]
        }
        for name in hooks:
            if not hasattr(load("lightning:LightningModule"), name):
                raise AssertionError(f"def {name}(self, ...): LightningModule has no hook {name}")
        if hooks:
            module.__class__ = type("WithHooks", (type(module),), hooks)

    def finish(self, ns: dict[str, Any], assigned: set[str]) -> int:
        import lightning as L

        trainers = [v for v in [ns.get("trainer"), *ns["__bare_values__"]] if isinstance(v, L.Trainer)]
        trainer = trainers[-1] if trainers else L.Trainer(**self.trainer_base(ns))
        if trainer.max_steps != STEPS:
            raise AssertionError(
                "the snippet's L.Trainer(...) drops the job's own arguments (max_steps): write L.Trainer(..., x=...)"
            )
        model = ns["model"]
        if isinstance(model, load("transformers:PreTrainedModel")):  # the snippet loaded the module's model
            ns["__module__"].model = model
            model = ns["__module__"]
        loader = ns["loader"]
        trainer.fit(model, train_dataloaders=loader)
        if ns["__module__"].in_step is not None:
            raise AssertionError("the snippet meant for training_step never ran")
        return int(trainer.global_step)


JOBS: dict[Framework, type[Job]] = {
    Framework.PYTORCH: PytorchJob,
    Framework.HF_TRAINER: HfTrainerJob,
    Framework.TRL: TrlJob,
    Framework.ACCELERATE: AccelerateJob,
    Framework.LIGHTNING: LightningJob,
    Framework.DEEPSPEED: PytorchJob,  # a DeepSpeed job's Python lines run in its plain PyTorch loop
}


def restore_process_state(threads: int) -> None:
    """What a snippet may change for the whole process, set back for the next one."""
    import torch

    gc.enable()
    gc.unfreeze()
    torch.autograd.set_detect_anomaly(False)
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- DeepSpeed configs


def deepspeed_config(parts: list[str], report: Report) -> dict[str, Any] | None:
    """The snippet's ds_config fragments merged over a small job's config (batch sizes, an optimizer)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        # torch's AdamW (torch_adam): DeepSpeed's FusedAdam would first compile its C++ op, minutes on a CI machine
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    for text in parts:
        fragment = parse_json_fragment(text, report)
        if fragment is None:
            return None
        for key, value in fragment.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
    config["train_batch_size"] = (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
    )
    return config


def run_deepspeed(config: dict[str, Any], model: Any, batch: dict[str, Any]) -> int:
    """DeepSpeed's own engine on CPU (its CPU accelerator, gloo): initialize, then steps."""
    import deepspeed

    saved = dict(
        os.environ
    )  # DeepSpeed sets LOCAL_RANK, RANK, WORLD_SIZE: no later job of this worker may see them
    try:
        os.environ.setdefault("LOCAL_RANK", "0")
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=json.loads(json.dumps(config))
        )
        steps = 0
        for _ in range(STEPS):
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
            steps += 1
        return steps
    finally:
        os.environ.clear()
        os.environ.update(saved)


def snippet_parts(snippet: str) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {"python": [], "shell": [], "json": [], "yaml": []}
    for part in segments(snippet):
        parts[part.kind].append(part.text)
    return parts
