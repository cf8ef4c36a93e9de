"""Reading training configurations (DeepSpeed JSON) into the few facts the rules need. Pure data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_OFF = ("none", "", None)


def _load(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    if isinstance(config, str | Path):
        data = json.loads(Path(config).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{config}: not a DeepSpeed config (top level is not an object)")
        return data
    to_dict = getattr(config, "to_dict", None) or getattr(config, "_param_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if isinstance(to_dict, dict):
        return to_dict
    raise ValueError(f"cannot read a DeepSpeed config from {type(config).__name__}")


def offload_from_deepspeed(config: Any) -> tuple[int | None, dict[str, str]]:
    """(ZeRO stage, {"optimizer": device, "param": device}) from a DeepSpeed config dict or file.

    Understands ``offload_optimizer`` / ``offload_param`` with ``device`` cpu / nvme / none, the older
    ``cpu_offload`` and ``cpu_offload_params`` booleans, and ``"auto"`` values (stage "auto" is unknown).
    Devices left at "none" are omitted, so ``{}`` means "no offload".
    """
    data = _load(config)
    zero = data.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        zero = {}
    stage_value = zero.get("stage")
    stage = int(stage_value) if isinstance(stage_value, int | str) and str(stage_value).isdigit() else None
    offload: dict[str, str] = {}
    for key, what in (("offload_optimizer", "optimizer"), ("offload_param", "param")):
        section = zero.get(key)
        if isinstance(section, dict):
            device = section.get("device")
            if isinstance(device, str) and device.lower() not in _OFF and device.lower() != "auto":
                offload[what] = device.lower()
    if zero.get("cpu_offload") is True:
        offload.setdefault("optimizer", "cpu")
    if zero.get("cpu_offload_params") is True or zero.get("cpu_offload_param") is True:
        offload.setdefault("param", "cpu")
    return stage, offload


def hpz_from_deepspeed(config: Any) -> int | None:
    """ZeRO++'s ``zero_hpz_partition_size`` (the ranks ZeRO-3's secondary weight partition spans); None when
    the config does not set it."""
    zero = _load(config).get("zero_optimization") or {}
    value = zero.get("zero_hpz_partition_size") if isinstance(zero, dict) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | str) and str(value).isdecimal() and int(value) >= 1:
        return int(value)
    return None
