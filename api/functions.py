"""Helpers for user callbacks: how many positional arguments a callback wants.

PySpark decides between ``f(rdd)`` and ``f(time, rdd)`` with ``func.__code__.co_argcount``, which
fails for ``functools.partial``, bound methods, callable objects and builtins. Here the decision is
made from ``inspect.signature``: the number of *required* positional parameters when it is one of
the accepted counts, otherwise the smallest accepted count the callback can take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any


def positional_arity(func: Callable[..., Any], choices: Sequence[int], what: str) -> int:
    """The number of positional arguments (one of ``choices``) to call ``func`` with."""
    if not callable(func):
        raise TypeError(f"{what} needs a function, got {type(func).__name__} {func!r:.100}")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return min(choices)
    required = optional = 0
    var_positional = False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is p.empty:
                required += 1
            else:
                optional += 1
        elif p.kind is p.VAR_POSITIONAL:
            var_positional = True
    if required in choices:
        return required
    for n in sorted(choices):
        if n >= required and (var_positional or n <= required + optional):
            return n
    forms = " or ".join(f"{n} positional argument{'s' if n != 1 else ''}" for n in sorted(choices))
    raise TypeError(f"the function given to {what} must take {forms}; {getattr(func, '__name__', func)!r} "
                    f"takes {required} required positional argument(s)")
