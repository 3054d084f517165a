"""Inputs and messages of bounded size.

- `clip(value)`: a value as an error message quotes it, at most ~200 characters. A message that
  quoted a whole case file's tensor once ran to 52 MB.
- `load_yaml` / `load_json`: a document parsed only if it expands to at most `max_elements`
  elements (every list, mapping and scalar, mapping keys included, counted as often as aliases
  repeat them). YAML aliases let 1 KB of text stand for 10⁹ numbers ("billion laughs"): PyYAML
  builds such a document cheaply (an alias is one shared object), but anything that walks it (a
  converter, a message that prints it) walks every copy. So the count is taken on YAML's node graph
  before any Python object is built, memoised per node: linear in the text, whatever the aliases
  expand to. JSON has no aliases; its count is bounded by its length and is only taken when the
  text is longer than the cap.

Refusals are UserErrors of one line (exit code 2).
"""

from __future__ import annotations

import json
import re
import reprlib
from typing import Any

import yaml

from runner.errors import UserError

QUOTE_LIMIT = 200
DEFAULT_MAX_ELEMENTS = 10_000_000

try:  # the C parser: ~10× faster on big case files
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 8, 8
_REPR.maxstring = _REPR.maxother = QUOTE_LIMIT


def clip(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """repr(value) in at most about `limit` characters. Containers are cut while their repr is
    built (reprlib: three levels, eight items each), never walked whole."""
    text = _REPR.repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…"


class TooLarge(UserError):
    pass


def _refuse(what: str, max_elements: int, how: str, hint: str) -> TooLarge:
    return TooLarge(f"{what}: {how} more than {max_elements:,} elements, the cap" + (f" ({hint})" if hint else ""))


def count_nodes(root: yaml.Node, max_elements: int, what: str, hint: str = "") -> int:
    """Elements `root` expands to (aliases counted as often as they are used), stopping at the cap.
    A node reached again through an alias adds its memoised count; a node that contains itself is
    refused (it expands without end)."""
    counts: dict[int, int] = {}
    active: set[int] = set()
    # iterative post-order walk: a deep document must not hit Python's recursion limit
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in counts and not children_done:
            continue
        if isinstance(node, yaml.ScalarNode):
            counts[key] = 1
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = [part for pair in node.value for part in pair]
        if not children_done:
            if key in active:
                raise TooLarge(f"{what}: a YAML alias refers to the node that contains it (it expands without end)")
            active.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in active:
                    raise TooLarge(f"{what}: a YAML alias refers to the node that contains it (it expands without end)")
                if id(child) not in counts:
                    stack.append((child, False))
            continue
        total = 1 + sum(counts[id(child)] for child in children)
        active.discard(key)
        if total > max_elements:
            raise _refuse(what, max_elements, "expands to", hint)
        counts[key] = total
    return counts[id(root)]


def load_yaml(text: str, what: str, max_elements: int | None = None, hint: str = "") -> Any:
    """yaml.safe_load(text), refused when it expands to more than max_elements elements (default
    DEFAULT_MAX_ELEMENTS; `what` names the input, `hint` says how to raise the cap). Parse errors
    propagate as yaml.YAMLError."""
    max_elements = DEFAULT_MAX_ELEMENTS if max_elements is None else max_elements
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        count_nodes(node, max_elements, what, hint)
        return loader.construct_document(node)
    finally:
        loader.dispose()


# a JSON value's start: a string, a number, a literal, or a container
_JSON_VALUE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|-?[0-9][0-9eE.+-]*|true|false|null|NaN|-?Infinity')


def load_json(text: str, what: str, max_elements: int | None = None, hint: str = "") -> Any:
    """json.loads(text), refused when it holds more than max_elements elements (default
    DEFAULT_MAX_ELEMENTS). Parse errors propagate as json.JSONDecodeError."""
    max_elements = DEFAULT_MAX_ELEMENTS if max_elements is None else max_elements
    # every element takes at least one character, so a short text needs no count
    if len(text) > max_elements:
        count = 0
        for _ in _JSON_VALUE.finditer(text):
            count += 1
            if count > max_elements:
                raise _refuse(what, max_elements, "holds", hint)
    return json.loads(text)
