"""Memoised validation: the same call twice costs a dictionary lookup, not a second validation.

Validation and geometry are pure functions of the attributes and shapes, and repeated calls
with the same ones are the common case (a training step).  A call's arguments become a key
that keeps each value's type (``[1, 1, 1, 1]`` and ``[True, 1, 1, 1]`` must not share an
entry: gradops refuses the second, which TF's wrapper would convert); arguments that cannot
be frozen (a NumPy array, a custom object) bypass the cache.  Exceptions are not cached, so
every invalid call is refused with its own message.  The cache is shared by threads: a lock
covers each lookup-and-reorder and each insert-and-evict (another thread's eviction between a
hit and its reorder would raise KeyError), but not the validation itself, which two threads
may then run for the same key.  A forked child gets new locks: one that another thread of the
parent held at the fork would never be released there.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

_SCALAR_TYPES = frozenset({str, bytes, int, float, bool, type(None)})


_MISSING = object()

#: Every memoised function's lock holder, so that a forked child can replace the locks.
_LOCK_HOLDERS: "weakref.WeakSet[_LockHolder]" = weakref.WeakSet()


class _LockHolder:
    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.Lock()


def _new_locks_in_child() -> None:
    for holder in list(_LOCK_HOLDERS):
        holder.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


class _Unfreezable(Exception):
    pass


def freeze(value: Any) -> Any:
    """A hashable key for ``value`` that keeps the type of every element."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return (kind, value)
    if kind is tuple or kind is list:
        types = tuple(map(type, value))
        if _SCALAR_TYPES.issuperset(types):  # the common case, shapes and attribute lists: no recursion
            return (kind, tuple(value), types)
        return (kind, tuple(freeze(v) for v in value))
    if kind.__module__ == "numpy" and getattr(value, "ndim", None) == 0 and kind.__name__ != "ndarray":
        return (kind, value)  # a NumPy scalar (np.int64(2), np.bool_(True))
    raise _Unfreezable


def memoised(maxsize: int = 256) -> Callable:
    """Decorator: cache ``fn``'s results by :func:`freeze` of its arguments (LRU, ``maxsize``)."""

    def decorate(fn: Callable) -> Callable:
        cache: OrderedDict = OrderedDict()
        holder = _LockHolder()
        _LOCK_HOLDERS.add(holder)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                key = (freeze(args), freeze(sorted(kwargs.items())))
            except _Unfreezable:
                return fn(*args, **kwargs)
            with holder.lock:
                result = cache.get(key, _MISSING)
                if result is not _MISSING:
                    cache.move_to_end(key)
                    return result
            result = fn(*args, **kwargs)
            with holder.lock:
                cache[key] = result
                cache.move_to_end(key)  # a thread that computed the same key meanwhile stored it earlier
                while len(cache) > maxsize:
                    cache.popitem(last=False)
            return result

        def cache_clear() -> None:
            with holder.lock:
                cache.clear()

        wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
        return wrapper

    return decorate
