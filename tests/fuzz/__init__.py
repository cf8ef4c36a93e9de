"""A fuzz harness for everything pitstop reads offline (see harness.py): ``python -m tests.fuzz --cases N``."""
