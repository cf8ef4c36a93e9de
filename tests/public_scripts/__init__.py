"""Support for running public training scripts (written outside pitstop) under ``pitstop doctor``."""
