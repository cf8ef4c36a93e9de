"""pitstop's version, at the bottom layer: every document names the version that wrote it, and a module that
writes one must not import the package root (the front door, which points up to every layer) to learn it."""

from __future__ import annotations

__version__ = "0.1.0"
