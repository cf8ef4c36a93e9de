"""YAML for configs, without surprises: safe tags only, and no "billion laughs".

PyYAML keeps an alias as a reference to the anchored node, so loading an alias bomb is cheap, but walking
the result is not. The document's *expanded* size is therefore counted on the node graph first (memoized,
so the count itself stays linear) and a document that would expand past a bound is refused.
"""

from __future__ import annotations

from typing import Any

from pitstop.artifacts import IngestError

MAX_EXPANDED_NODES = 200_000
YAML_LIMIT = 4 * 2**20


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a cycle counts once rather than recursing forever
    value = node.value
    size = 1
    if isinstance(value, list):
        for item in value:
            if isinstance(item, tuple):  # a mapping's (key, value) pair
                size += _expanded_size(item[0], memo) + _expanded_size(item[1], memo)
            else:
                size += _expanded_size(item, memo)
            if size > MAX_EXPANDED_NODES:
                break
    memo[key] = size
    return size


def load_yaml(text: str, name: str) -> Any:
    """The document, composed once (with libyaml when present, which is ~10x faster) and built from the node
    graph only after its expanded size is known. Refuses YAML over YAML_LIMIT: no config is that large, and
    the parser's cost per byte is high."""
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - pyyaml is a dependency
        raise IngestError("reading YAML needs pyyaml: pip install pyyaml") from exc
    if len(text) > YAML_LIMIT:
        raise IngestError(f"{name}: YAML larger than {YAML_LIMIT // 2**20} MiB, which no config is")
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_EXPANDED_NODES:
            raise IngestError(f"{name}: YAML that expands past {MAX_EXPANDED_NODES:,} nodes (an alias bomb?)")
        return loader.construct_document(node)
    except IngestError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = str(getattr(exc, "problem", "") or "")[:120]
        where = ", ".join(x for x in (problem, f"line {mark.line + 1}" if mark is not None else "") if x)
        raise IngestError(f"{name}: not valid YAML" + (f" ({where})" if where else "")) from None
    except RecursionError:
        raise IngestError(f"{name}: YAML nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar the constructor cannot build (an int
        # of 5,000 digits, a date of month 13)
        raise IngestError(f"{name}: not valid YAML ({str(exc).splitlines()[0][:200]})") from None
    finally:
        loader.dispose()
