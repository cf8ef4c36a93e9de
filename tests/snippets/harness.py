"""Reading a remedy's snippet as a user would paste it: split into its Python, shell, DeepSpeed-JSON and
accelerate-YAML parts, fill the placeholders mechanically, and check every name and keyword argument against
the real API (``inspect.signature`` of the installed transformers / trl / lightning / accelerate / torch).

The fast checks here import the libraries but run nothing; ``tests.snippets.jobs`` executes the Python parts
inside a tiny real job of each framework.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pitstop.core.vocabulary import Framework

# a placeholder the user replaces: "<larger>", "<the faster cards' indices>"; filled with a small number
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]*>")
PLACEHOLDER_VALUE = "2"
SHELL_LINE = re.compile(
    r"^((export|unset|pip|sudo|nvidia-smi|torchrun|accelerate|deepspeed|python|trl|ibv_devinfo|nproc)(\s|$)"
    r"|([A-Z_][A-Z0-9_]*=\S*\s+)+\S)"
)
YAML_LINE = re.compile(r"^\s*[A-Za-z_][\w.-]*:\s+\S")

# where each name a snippet may use without importing it comes from: what a script of that kind imports
LIBRARY = {
    "torch": "torch",
    "gc": "gc",
    "os": "os",
    "contextlib": "contextlib",
    "dist": "torch.distributed",
    "L": "lightning",
    "DataLoader": "torch.utils.data:DataLoader",
    "DistributedSampler": "torch.utils.data:DistributedSampler",
    "DDP": "torch.nn.parallel:DistributedDataParallel",
    "DistributedDataParallel": "torch.nn.parallel:DistributedDataParallel",
    "FSDP": "torch.distributed.fsdp:FullyShardedDataParallel",
    "FullyShardedDataParallel": "torch.distributed.fsdp:FullyShardedDataParallel",
    "ShardingStrategy": "torch.distributed.fsdp:ShardingStrategy",
    "CPUOffload": "torch.distributed.fsdp:CPUOffload",
    "fully_shard": "torch.distributed.fsdp:fully_shard",
    "checkpoint_wrapper": "torch.distributed.algorithms._checkpoint.checkpoint_wrapper:checkpoint_wrapper",
    "CheckpointImpl": "torch.distributed.algorithms._checkpoint.checkpoint_wrapper:CheckpointImpl",
    "TrainingArguments": "transformers:TrainingArguments",
    "Trainer": "transformers:Trainer",
    "TrainerCallback": "transformers:TrainerCallback",
    "AutoModelForCausalLM": "transformers:AutoModelForCausalLM",
    "DataCollatorForSeq2Seq": "transformers:DataCollatorForSeq2Seq",
    "BitsAndBytesConfig": "transformers:BitsAndBytesConfig",
    "SFTConfig": "trl:SFTConfig",
    "SFTTrainer": "trl:SFTTrainer",
    "GRPOConfig": "trl:GRPOConfig",
    "Accelerator": "accelerate:Accelerator",
    "DistributedDataParallelKwargs": "accelerate:DistributedDataParallelKwargs",
    "DDPCommunicationHookType": "accelerate.utils:DDPCommunicationHookType",
    "FullyShardedDataParallelPlugin": "accelerate:FullyShardedDataParallelPlugin",
    "DDPStrategy": "lightning.pytorch.strategies:DDPStrategy",
    "FSDPStrategy": "lightning.pytorch.strategies:FSDPStrategy",
    "ModelCheckpoint": "lightning.pytorch.callbacks:ModelCheckpoint",
    "AsyncCheckpointIO": "lightning.pytorch.plugins.io:AsyncCheckpointIO",
    "init_device_mesh": "torch.distributed.device_mesh:init_device_mesh",
    "F": "torch.nn.functional",
    "get_peft_model": "peft:get_peft_model",
    "LoraConfig": "peft:LoraConfig",
}

# the placeholders written as names (a batch size B, an interval N, ...): the job gives them small values
PLACEHOLDER_NAMES = {"N": 2, "B": 2, "A": 1, "E": 2, "S": 1, "I": 4}

# the job's own objects a snippet names, by framework, with the type a static check reads methods from
_COMMON_JOB: dict[str, JobType] = {
    "model": ("transformers:LlamaForCausalLM", "torch.nn.parallel:DistributedDataParallel"),
    "name": None,  # the model's name or folder
    "tokenizer": "transformers:PreTrainedTokenizerFast",
    "train": "torch.utils.data:Dataset",
    "dataset": "torch.utils.data:Dataset",
    "raw": "datasets:Dataset",
    "tokenize": None,
    "collate": None,
    "loader": "torch.utils.data:DataLoader",
    "opt": "torch.optim:AdamW",
    "optimizer": "torch.optim:AdamW",
    "batch": None,
    "loss": "torch:Tensor",
    "running": "torch:Tensor",
    "step": None,
    "i": None,
    "accum": None,
    "rows": None,
    "lengths": None,
    "log": None,
    "evaluate": None,
    "state_dict": None,
    "path": None,
    "block": None,
    "layer": None,
    "inputs": None,
    "x": None,
    "device": None,
    "local_rank": None,
    "world_size": None,
    # inside the model's own code (a forward the user wrote): its module, tensors and sizes
    "self": "torch.nn:Module",
    "query": None,
    "key": None,
    "value": None,
    "mask": None,
    "q": None,
    "k": None,
    "v": None,
    "expert_ids": None,
    "top_k": None,
    "w_up": None,
    "w_down": None,
    "act": None,
}
JobType = str | tuple[str, ...] | None
JOB_NAMES: dict[Framework, dict[str, JobType]] = {
    Framework.PYTORCH: {
        **_COMMON_JOB,
        "prompts": None,
        "model_path": None,
        "num_generations": None,
        "max_new_tokens": None,
    },
    Framework.HF_TRAINER: {
        **_COMMON_JOB,
        "args": "transformers:TrainingArguments",
        "trainer": "transformers:Trainer",
    },
    Framework.TRL: {
        **_COMMON_JOB,
        "args": "trl:SFTConfig",
        "config": "trl:SFTConfig",
        "trainer": "trl:SFTTrainer",
    },
    Framework.ACCELERATE: {**_COMMON_JOB, "accelerator": "accelerate:Accelerator"},
    Framework.LIGHTNING: {
        **_COMMON_JOB,
        "self": "lightning:LightningModule",  # inside the LightningModule's training_step
        "trainer": "lightning:Trainer",
        "Block": None,  # the model's block class
    },
    Framework.DEEPSPEED: {**_COMMON_JOB, "engine": None},
}


def load(spec: str) -> Any:
    """``module`` or ``module:attribute`` -> the object."""
    module, _, attribute = spec.partition(":")
    obj = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        obj = getattr(obj, part)
    return obj


@dataclass
class Segment:
    """One part of a snippet in one language, as the user would paste it."""

    kind: str  # python | shell | json | yaml
    text: str
    first_line: int


def fill_placeholders(text: str) -> str:
    return PLACEHOLDER.sub(PLACEHOLDER_VALUE, text)


def _depth(line: str) -> int:
    """Open brackets left by one line (strings and comments ignored)."""
    depth, quote = 0, ""
    for ch in line:
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth


def _is_python(line: str) -> bool:
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return line.rstrip().endswith((":", ",", "(", "[", "{", "\\"))  # a statement that goes on below
    # "key: value" parses as a bare annotation, which no snippet means: it is YAML
    return not (
        len(tree.body) == 1 and isinstance(tree.body[0], ast.AnnAssign) and tree.body[0].value is None
    )


def segments(snippet: str) -> list[Segment]:
    """The snippet's parts, in order; comment-only lines belong to none (a Python part keeps its own)."""
    parts: list[Segment] = []
    current: Segment | None = None
    depth = 0
    for number, raw in enumerate(fill_placeholders(snippet).splitlines(), 1):
        stripped = raw.strip()
        continuing = current is not None and (depth > 0 or (raw[:1].isspace() and current.kind != "shell"))
        if continuing and current is not None:
            if not (current.kind == "json" and stripped.startswith("#")):
                current.text += "\n" + raw
                depth += _depth(raw)
            continue
        if not stripped:
            current, depth = None, 0
            continue
        if stripped.startswith("#"):
            if current is not None and current.kind == "python":
                current.text += "\n" + raw
            continue
        if SHELL_LINE.match(stripped):
            kind = "shell"
        elif stripped.startswith(('"', "{")):
            kind = "json"
        elif YAML_LINE.match(raw) and not _is_python(raw):
            kind = "yaml"
        else:
            kind = "python"
        if current is not None and current.kind == kind and kind != "shell":
            current.text += "\n" + raw
        else:
            current = Segment(kind, raw, number)
            parts.append(current)
        depth = _depth(raw) if kind != "shell" else 0
    for part in parts:
        if part.kind == "python":
            part.text = _dedent_block(part.text)
    return parts


def _dedent_block(text: str) -> str:
    """A Python part whose first line is indented (a YAML-like fragment never is) keeps its shape."""
    lines = text.splitlines()
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(x[indent:] for x in lines)


# ---------------------------------------------------------------- static checks


@dataclass(frozen=True)
class TypeRef:
    """A job object known only by its type(s) (a static check reads its methods from the classes)."""

    classes: tuple[Any, ...]


UNKNOWN = object()


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)

    def add(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")


def bound_names(tree: ast.AST) -> set[str]:
    """Every name the snippet binds itself (assignments, imports, defs, loop and with targets, parameters)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def free_names(tree: ast.AST) -> set[str]:
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - bound_names(tree) - set(dir(builtins))


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def check_keywords(obj: Any, keywords: dict[str, ast.expr], what: str, report: Report) -> None:
    """An unknown keyword argument of a real callable is a failure (a ``**kwargs`` callable takes any), and so
    is a constant outside the Literal values its annotation allows."""
    sig = _signature(obj)
    if sig is None:
        return
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        for kw in keywords:
            if kw not in sig.parameters:
                report.add(
                    what, f"{kw}= is not an argument of {getattr(obj, '__qualname__', obj)}{sig}"[:300]
                )
    hints = _hints(obj)
    for kw, node in keywords.items():
        allowed = _literal_values(hints.get(kw))
        if allowed is None:
            continue
        try:
            value = ast.literal_eval(node)
        except ValueError:
            continue
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value not in allowed:
            report.add(what, f"{kw}={value!r} is none of {sorted(map(str, allowed))}"[:300])


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return _cached_hints(obj)
    except TypeError:  # unhashable
        return {}


@cache
def _cached_hints(obj: Any) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(obj.__init__ if inspect.isclass(obj) else obj)
    except Exception:  # unresolvable forward references: no value check
        return {}


def _literal_values(hint: Any) -> set[Any] | None:
    """The values a Literal annotation allows; None when it also takes a plain type (any string...)."""
    import typing

    if hint is None:
        return None
    if typing.get_origin(hint) is typing.Literal:
        return set(typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        values: set[Any] = set()
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            inner = _literal_values(arg)
            if inner is None:
                return None
            values |= inner
        return values or None
    return None


class StaticChecker:
    """Resolves the snippet's names to the real objects and checks calls, attributes and hooks."""

    def __init__(self, framework: Framework) -> None:
        self.framework = framework
        self.job = JOB_NAMES[framework]

    def check(self, source: str, report: Report) -> ast.Module | None:
        try:
            tree = ast.parse(fill_placeholders(source))
        except SyntaxError as exc:
            report.add("python", f"does not parse: {exc}")
            return None
        allowed = set(LIBRARY) | set(self.job) | set(PLACEHOLDER_NAMES)
        for name in sorted(free_names(tree) - allowed):
            report.add(
                "python",
                f"uses {name!r}, which it neither defines nor imports, nor a {self.framework} job has",
            )
        own = bound_names(tree)
        imported: dict[str, Any] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    try:
                        imported[alias.asname or alias.name] = getattr(
                            importlib.import_module(node.module), alias.name
                        )
                    except ImportError as exc:
                        if node.module.split(".")[0] not in OPTIONAL_PACKAGES:
                            report.add("python", f"from {node.module} import {alias.name}: {exc}")
                    except AttributeError:
                        report.add("python", f"{node.module} has no {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] not in OPTIONAL_PACKAGES:
                        try:
                            importlib.import_module(alias.name)
                        except ImportError as exc:
                            report.add("python", f"import {alias.name}: {exc}")
        self._own, self._imported = own - set(imported), imported
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                target = self.resolve(node.func, report)
                if target is not UNKNOWN and not isinstance(target, TypeRef):
                    keywords = {k.arg: k.value for k in node.keywords if k.arg}
                    check_keywords(target, keywords, ast.unparse(node.func), report)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self.resolve(node, report)  # an attribute the snippet sets must exist
            elif isinstance(node, ast.ClassDef):
                self._check_hooks(node, report)
        return tree

    def resolve(self, node: ast.expr, report: Report) -> Any:
        """The real object an expression names, a TypeRef for a job object, or UNKNOWN."""
        if isinstance(node, ast.Name):
            if node.id in self._imported:
                return self._imported[node.id]
            if node.id in self._own:
                return UNKNOWN
            if node.id in LIBRARY:
                return load(LIBRARY[node.id])
            spec = self.job.get(node.id)
            if not spec:
                return UNKNOWN
            return TypeRef(tuple(load(x) for x in ((spec,) if isinstance(spec, str) else spec)))
        if not isinstance(node, ast.Attribute):
            return UNKNOWN
        base = self.resolve(node.value, report)
        if base is UNKNOWN:
            return UNKNOWN
        if isinstance(base, TypeRef):  # a method of the job object's class (instance attributes are unseen)
            found = [getattr(c, node.attr) for c in base.classes if hasattr(c, node.attr)]
            if not found:
                if node.attr not in _INSTANCE_ATTRIBUTES:
                    names = " / ".join(c.__name__ for c in base.classes)
                    report.add(ast.unparse(node), f"{names} has no {node.attr!r}")
                return UNKNOWN
            return found[0] if callable(found[0]) else UNKNOWN
        try:
            return getattr(base, node.attr)
        except AttributeError:
            if inspect.ismodule(base):
                try:  # a submodule not imported yet
                    return importlib.import_module(f"{base.__name__}.{node.attr}")
                except ImportError:
                    pass
            owner = getattr(base, "__name__", type(base).__name__)
            report.add(ast.unparse(node), f"{owner} has no {node.attr!r}")
            return UNKNOWN

    def _check_hooks(self, node: ast.ClassDef, report: Report) -> None:
        """A callback's hooks: each method must be one its base defines, with the base's parameters."""
        for base_node in node.bases:
            base = self.resolve(base_node, report)
            if not inspect.isclass(base):
                continue
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                hook = getattr(base, item.name, None)
                if hook is None:
                    report.add(node.name, f"{base.__name__} has no hook {item.name}")
                    continue
                want = [p for p in inspect.signature(hook).parameters.values() if p.kind is not p.VAR_KEYWORD]
                got = [a.arg for a in item.args.args]
                if got != [p.name for p in want] and not (
                    item.args.kwarg and got == [p.name for p in want][: len(got)]
                ):
                    report.add(
                        f"{node.name}.{item.name}",
                        f"takes {got}, {base.__name__} calls it with {[p.name for p in want]}",
                    )


# attributes a job object has on its instances, not its class (a static check cannot see them)
_INSTANCE_ATTRIBUTES = {"config", "model", "attn", "module", "state", "args"}
# packages a snippet may import that this machine lacks (GPU-only or optional): the import is not tried
OPTIONAL_PACKAGES = {
    "liger_kernel": "Liger kernels are Triton (GPU) kernels: a GPU machine's package, checked statically here",
    "vllm": "vLLM needs a GPU: a GPU machine's package, checked statically here",
}


# ---------------------------------------------------------------- shell, DeepSpeed JSON, accelerate YAML


def check_shell(text: str, report: Report) -> None:
    """Quoting at least (``bash -n`` runs in the slow tier)."""
    for line in text.splitlines():
        try:
            shlex.split(line, comments=True)
        except ValueError as exc:
            report.add("shell", f"{line!r}: {exc}")


def parse_json_fragment(text: str, report: Report) -> dict[str, Any] | None:
    """A ds_config fragment ('"key": value, ...'), as it would sit inside the file's braces."""
    body = re.sub(
        r"(?<=[:\s\[])([A-Z])(?=\s*[,}\]]|\s*$)", lambda m: str(PLACEHOLDER_NAMES.get(m[1], 2)), text
    )
    body = body.strip().rstrip(",")
    try:
        value = json.loads(body if body.startswith("{") else "{" + body + "}")
    except json.JSONDecodeError as exc:
        report.add("ds_config", f"not JSON (a user pastes it into ds_config.json): {exc}: {text!r}"[:300])
        return None
    return value if isinstance(value, dict) else None


@cache
def deepspeed_top_keys() -> frozenset[str]:
    """Every top-level key DeepSpeed's config reads (its constants module names them)."""
    constants = load("deepspeed.runtime.constants")
    names = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}
    for module in ("deepspeed.runtime.zero.config", "deepspeed.runtime.precision_config"):
        names |= {v for k, v in vars(load(module)).items() if k.isupper() and isinstance(v, str)}
    return frozenset(names)


def check_deepspeed(config: dict[str, Any], report: Report) -> None:
    """Keys DeepSpeed does not know are failures; the ZeRO section is validated by DeepSpeed's own model."""
    known = deepspeed_top_keys()
    for key, value in config.items():
        if key not in known:
            report.add("ds_config", f"DeepSpeed reads no top-level key {key!r}")
        if key == "zero_optimization":
            zero_config = load("deepspeed.runtime.zero.config:DeepSpeedZeroConfig")
            try:
                zero_config(**value)
            except Exception as exc:  # pydantic's ValidationError names the bad field
                report.add("ds_config", f"zero_optimization: {exc}"[:400])
        if key in ("bf16", "fp16") and not isinstance(value, dict):
            report.add("ds_config", f"{key} must be an object")


@cache
def accelerate_config_keys() -> frozenset[str]:
    """The keys ``accelerate config`` writes: its ClusterConfig fields and the fsdp/deepspeed config keys."""
    cluster = load("accelerate.commands.config.config_args:ClusterConfig")
    keys = set(getattr(cluster, "__dataclass_fields__", {}))
    # a config file's fsdp_config / deepspeed_config entries become `accelerate launch --<key>` options
    source = inspect.getsource(load("accelerate.commands.launch"))
    keys |= set(re.findall(r'"--((?:fsdp|deepspeed|dynamo|megatron_lm)_\w+|offload_\w+|zero\w*)"', source))
    return frozenset(keys)


def check_accelerate_yaml(text: str, report: Report) -> None:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        report.add("accelerate config", f"not YAML: {exc}")
        return
    if not isinstance(data, dict):
        report.add("accelerate config", f"not a mapping: {text!r}")
        return
    known = accelerate_config_keys()
    for key, value in data.items():
        if key not in known:
            report.add("accelerate config", f"accelerate config has no key {key!r}")
        if key == "distributed_type":
            kinds = load("accelerate.utils:DistributedType")
            if value not in {k.value for k in kinds}:
                report.add(
                    "accelerate config", f"distributed_type {value!r} is none of {[k.value for k in kinds]}"
                )


def check_snippet(snippet: str, framework: Framework) -> tuple[Report, list[Segment]]:
    """Every part of one snippet checked without running it."""
    report = Report()
    parts = segments(snippet)
    checker = StaticChecker(framework)
    python = "\n".join(p.text for p in parts if p.kind == "python")
    if python:
        checker.check(python, report)
    for part in parts:
        if part.kind == "shell":
            check_shell(part.text, report)
        elif part.kind == "json":
            config = parse_json_fragment(part.text, report)
            if config is not None:
                check_deepspeed(config, report)
        elif part.kind == "yaml":
            check_accelerate_yaml(part.text, report)
    return report, parts
