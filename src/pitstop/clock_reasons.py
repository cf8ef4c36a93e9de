"""NVML's clock-event (throttle) reason bits and their names, for the probe that reads them and the rule
that judges them."""

from __future__ import annotations

# NVML's reason bits (nvml.h: nvmlClocksEventReason*)
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

THROTTLING: dict[
    int, str
] = {  # the reasons that slow a busy GPU below its clock, by the name nvidia-smi prints
    SW_POWER_CAP: "SW power cap",
    HW_SLOWDOWN: "HW slowdown",
    SW_THERMAL_SLOWDOWN: "SW thermal slowdown",
    HW_THERMAL_SLOWDOWN: "HW thermal slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "HW power brake slowdown",
}
THROTTLING_MASK = sum(THROTTLING)
HARDWARE_MASK = HW_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLING.items() if mask & bit]
