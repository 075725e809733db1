"""Memoised validation: the same call twice costs a dictionary lookup, not a second validation.

Validation and geometry are pure functions of the attributes and shapes, and repeated calls
with the same ones are the common case (a training step).  A call's arguments become a key
that keeps each value's type (``[1, 1, 1, 1]`` and ``[True, 1, 1, 1]`` must not share an
entry: TF refuses the second); arguments that cannot be frozen (a NumPy array, a custom
object) bypass the cache.  Exceptions are not cached, so every invalid call is refused with
its own message.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any, Callable

_SCALARS = (str, bytes, int, float, bool, type(None))


class _Unfreezable(Exception):
    pass


def freeze(value: Any) -> Any:
    """A hashable key for ``value`` that keeps the type of every element."""
    if isinstance(value, _SCALARS) or type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.ndim == 0:
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(freeze(v) for v in value))
    raise _Unfreezable


def memoised(maxsize: int = 256) -> Callable:
    """Decorator: cache ``fn``'s results by :func:`freeze` of its arguments (LRU, ``maxsize``)."""

    def decorate(fn: Callable) -> Callable:
        cache: OrderedDict = OrderedDict()

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                key = (freeze(args), freeze(sorted(kwargs.items())))
            except _Unfreezable:
                return fn(*args, **kwargs)
            try:
                result = cache[key]
            except KeyError:
                result = cache[key] = fn(*args, **kwargs)
                if len(cache) > maxsize:
                    cache.popitem(last=False)
            else:
                cache.move_to_end(key)
            return result

        wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
        return wrapper

    return decorate
