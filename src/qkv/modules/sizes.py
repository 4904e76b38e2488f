"""What the modules accept as a size (heads, widths): a positive whole number."""

from __future__ import annotations

import numbers

__all__ = ["is_size"]


def is_size(value: object) -> bool:
    """A positive integer: a Python or numpy int, not a bool, a float or a string."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1
