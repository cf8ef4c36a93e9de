"""The demo's data: instruction / response pairs made from the standard library's own docstrings.

Every Python installation has this text, so the demo runs offline on a fresh machine. The pairs vary in
length the way real instruction data does (a one-line docstring next to a long one), which is exactly
what makes padding to a fixed length wasteful.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

MODULES = (
    "abc",
    "argparse",
    "array",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "cmath",
    "codecs",
    "collections",
    "colorsys",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http.client",
    "imaplib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "math",
    "mimetypes",
    "numbers",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "pickletools",
    "platform",
    "plistlib",
    "pprint",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "trace",
    "traceback",
    "types",
    "typing",
    "unicodedata",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml.dom.minidom",
    "xml.etree.ElementTree",
    "zipfile",
    "zlib",
)

MAX_RESPONSE_CHARS = 900


@dataclass(frozen=True)
class Pair:
    instruction: str
    response: str


def _clean(doc: str) -> str:
    doc = inspect.cleandoc(doc)
    paragraphs = [p for p in re.split(r"\n\s*\n", doc) if p.strip()]
    text = "\n\n".join(paragraphs[:3])
    return text[:MAX_RESPONSE_CHARS].strip()


def _describe(kind: str, qualname: str) -> str:
    return {
        "module": f"What is the Python module `{qualname}` for?",
        "class": f"Explain the class `{qualname}` from the Python standard library.",
        "function": f"What does `{qualname}` do in Python?",
    }[kind]


def build_pairs(limit: int | None = None) -> list[Pair]:
    """Deterministic list of pairs (same Python version → same list)."""
    pairs: list[Pair] = []
    seen: set[str] = set()
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # a module missing from a trimmed-down Python is fine
            continue
        candidates: list[tuple[str, str, object]] = [("module", name, module)]
        for attr in sorted(vars(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(obj):
                candidates.append(("class", f"{name}.{attr}", obj))
            elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
                candidates.append(("function", f"{name}.{attr}", obj))
        for kind, qualname, obj in candidates:
            doc = getattr(obj, "__doc__", None)
            if not isinstance(doc, str) or len(doc.strip()) < 20:
                continue
            response = _clean(doc)
            if response in seen:
                continue
            seen.add(response)
            pairs.append(Pair(_describe(kind, qualname), response))
            if limit is not None and len(pairs) >= limit:
                return pairs
    return pairs
