"""YAML as qkv's configs read it: YAML 1.2's core schema, no aliases, a bounded depth, an
error for a key given twice, and PyYAML's errors as one short line.

PyYAML follows YAML 1.1, where ``steps: 1:30:00`` is the base-60 number 5400, ``yes``,
``no``, ``on`` and ``off`` are booleans, ``010`` is octal 8 and ``5e-4`` is a string. A
config is read with the YAML 1.2 core schema instead:

- null: ``~``, ``null`` (``Null``, ``NULL``) and an empty value;
- booleans: ``true`` and ``false`` (``True``, ``TRUE``, ``False``, ``FALSE``) only;
- integers: ``123``, ``-7``, ``0o17``, ``0x1F`` (``010`` is ten; ``_`` may group digits, as
  in ``20_000``), at most ``sys.get_int_max_str_digits()`` digits;
- floats: ``1.5``, ``5e-4``, ``1E3``, ``.5``, ``.inf``, ``-.inf``, ``.nan``;
- everything else is a string: ``1:30:00``, ``yes``, ``on``, ``2024-01-01``.

Aliases (``*name``) are refused where they are written: a few hundred bytes of nested
aliases expand to gigabytes (the "billion laughs"). Lists and mappings nest at most
:data:`MAX_DEPTH` deep, so that deep nesting is an error instead of a ``RecursionError``.
"""

from __future__ import annotations

import functools
import math
import re
import sys

import yaml

__all__ = ["MAX_DEPTH", "yaml_error", "yaml_loader"]

MAX_DEPTH = 50  # a recipe nests three levels; each level is a Python stack frame or more
_MESSAGE_CHARS = 200  # the longest problem or context text quoted from PyYAML

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9](?:[0-9_]*[0-9])?|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


@functools.cache
def yaml_loader():
    """A PyYAML loader for configs: the YAML 1.2 core schema, no aliases, bounded depth.

    Returns:
        A ``yaml.SafeLoader`` subclass for ``yaml.load(text, Loader=...)``. Every failure
        is a ``yaml.YAMLError`` with a mark (line and column) that :func:`yaml_error`
        turns into one line.
    """

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers: dict = {}  # YAML 1.1's resolvers, replaced below
        yaml_constructors = dict(yaml.SafeLoader.yaml_constructors)

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"found the alias *{_cut(event.anchor, 40)}: configs do not read aliases "
                    "(write the value again)",
                    event.start_mark,
                )
            if self.check_event(yaml.CollectionStartEvent):
                self._depth = getattr(self, "_depth", 0) + 1
                try:
                    if self._depth > MAX_DEPTH:
                        raise yaml.composer.ComposerError(
                            None,
                            None,
                            f"lists and mappings nested more than {MAX_DEPTH} levels deep",
                            self.peek_event().start_mark,
                        )
                    return super().compose_node(parent, index)
                finally:
                    self._depth -= 1
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            _refuse_duplicate_keys(node)  # PyYAML keeps the last one, silently
            return super().construct_mapping(node, deep=deep)

    for tag, pattern, first in (
        ("null", _NULL, ["~", "n", "N", ""]),
        ("bool", _BOOL, list("tTfF")),
        ("int", _INT, list("-+0123456789")),
        ("float", _FLOAT, list("-+.0123456789")),
    ):
        Loader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", pattern, first)
    Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
    Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
    del Loader.yaml_constructors["tag:yaml.org,2002:timestamp"]  # dates stay strings
    return Loader


def _not_a(node, kind: str):
    return yaml.constructor.ConstructorError(
        None, None, f"{_cut(repr(node.value), 40)} is not a !!{kind} value", node.start_mark
    )


def _construct_bool(loader, node) -> bool:
    value = loader.construct_scalar(node)
    if not _BOOL.match(value):
        raise _not_a(node, "bool")
    return value.lower() == "true"


def _construct_int(loader, node) -> int:
    value = loader.construct_scalar(node)
    if not _INT.match(value):
        raise _not_a(node, "int")
    text = value.replace("_", "")
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    digits = text.lstrip("-+") if base == 10 else text[2:]
    limit = sys.get_int_max_str_digits()
    if base == 10 and limit and len(digits) > limit:  # int() would raise a ValueError
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"an integer of {len(digits)} digits ({_cut(digits, 24)}; at most {limit})",
            node.start_mark,
        )
    return int(text, 0 if base != 10 else 10)


def _construct_float(loader, node) -> float:
    value = loader.construct_scalar(node)
    if _INT.match(value) and not value.startswith(("0o", "0x")):  # !!float 3
        value = value + ".0"
    if not _FLOAT.match(value):
        raise _not_a(node, "float")
    text = value.replace("_", "").lower()
    if text.lstrip("-+") == ".inf":
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _refuse_duplicate_keys(node) -> None:
    """A key given twice in one mapping (a second ``train:`` section) is a YAML error."""
    first = {}
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            mark = first.setdefault((key.tag, key.value), key.start_mark)
            if mark is not key.start_mark:
                where = f"first at line {mark.line + 1}, column {mark.column + 1}"
                problem = f"duplicate key {_cut(repr(key.value), 60)}, {where}"
                raise yaml.constructor.ConstructorError(None, None, problem, key.start_mark)


def yaml_error(err: Exception) -> str:
    """PyYAML's message on one short line: the problem, where it is, and the context."""
    problem = getattr(err, "problem", None)
    if problem is None:
        return _cut(" ".join(str(err).split()), _MESSAGE_CHARS)
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}{_cut(' '.join(problem.split()), _MESSAGE_CHARS)}"
    context, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context:
        started = f" started at line {cmark.line + 1}, column {cmark.column + 1}" if cmark else ""
        text += f" ({_cut(' '.join(context.split()), _MESSAGE_CHARS)}{started})"
    return text


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ``…`` marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
