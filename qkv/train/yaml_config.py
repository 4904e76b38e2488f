"""YAML as qkv's configs read it: PyYAML's safe loader, with YAML 1.2's floats (``5e-4``)
and an error for a key given twice, and PyYAML's errors as one line."""

from __future__ import annotations

import functools
import re

import yaml

__all__ = ["yaml_error", "yaml_loader"]


@functools.cache
def yaml_loader():
    """PyYAML's safe loader, reading ``5e-4`` and ``1E3`` as floats (YAML 1.2) as well.

    YAML 1.1, which PyYAML follows, needs a dot and a signed exponent (``5.0e-4``), so the
    way learning rates are usually written came through as the string '5e-4'.
    """

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            _refuse_duplicate_keys(node)  # PyYAML keeps the last one, silently
            return super().construct_mapping(node, deep=deep)

    exponent_form = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(exponent_form), list("-+.0123456789")
    )
    return Loader


def _refuse_duplicate_keys(node) -> None:
    """A key given twice in one mapping (a second ``train:`` section) is a YAML error."""
    first = {}
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            mark = first.setdefault((key.tag, key.value), key.start_mark)
            if mark is not key.start_mark:
                where = f"first at line {mark.line + 1}, column {mark.column + 1}"
                problem = f"duplicate key {key.value!r}, {where}"
                raise yaml.constructor.ConstructorError(None, None, problem, key.start_mark)


def yaml_error(err: Exception) -> str:
    """PyYAML's message on one line: the problem, where it is, and the context."""
    problem = getattr(err, "problem", None)
    if problem is None:
        return " ".join(str(err).split())
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}{problem}"
    context, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context:
        started = f" started at line {cmark.line + 1}, column {cmark.column + 1}" if cmark else ""
        text += f" ({context}{started})"
    return text
