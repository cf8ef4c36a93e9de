"""Turning artifacts users already have (traces, nvidia-smi logs, Trainer outputs, configs) into RunProfiles."""
