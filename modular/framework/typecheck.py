"""Checks of values against type hints, and of one hint against another (output feeds input)."""

from __future__ import annotations

import types
import typing
from typing import Any

__all__ = ["value_matches", "hint_fits", "type_name"]

_UNION_TYPES = (typing.Union, types.UnionType)


def _members(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union hint, or the hint alone."""
    if typing.get_origin(hint) in _UNION_TYPES:
        return typing.get_args(hint)
    return (hint,)


def _is_open(hint: Any) -> bool:
    """True for hints that accept anything: no hint, Any, or something that is not a type."""
    if hint is None or hint is Any:
        return True
    origin = typing.get_origin(hint)
    return origin is None and not isinstance(hint, type)


def value_matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits ``hint``. Unions, ``list[X]``/``tuple``/``dict`` generics and ``Any`` are
    understood; an int is accepted where a float is expected; unknown hint forms accept anything."""
    if value is None or _is_open(hint):
        return True
    for member in _members(hint):
        if member is Any or member is type(None) and value is None:
            return True
        if _is_open(member):
            return True
        origin = typing.get_origin(member)
        if origin is None:
            if member is float and isinstance(value, int) and not isinstance(value, bool):
                return True
            if isinstance(value, member):
                return True
            continue
        if not isinstance(origin, type) or not isinstance(value, origin):
            continue
        args = typing.get_args(member)
        # isinstance again: it tells the checker that ``value`` is iterable (origin is one of these)
        if origin in (list, set, frozenset) and args and isinstance(value, list | set | frozenset):
            if all(value_matches(item, args[0]) for item in value):
                return True
            continue
        return True
    return False


def hint_fits(produced: Any, consumed: Any) -> bool:
    """Whether every value of hint ``produced`` (an output) can be a value of hint ``consumed`` (an input)."""
    if _is_open(produced) or _is_open(consumed):
        return True
    consumed_members = _members(consumed)
    return all(_one_fits(member, consumed_members) for member in _members(produced))


def _one_fits(produced: Any, consumed_members: tuple[Any, ...]) -> bool:
    if _is_open(produced):
        return True
    p_origin = typing.get_origin(produced) or produced
    for consumed in consumed_members:
        if _is_open(consumed):
            return True
        c_origin = typing.get_origin(consumed) or consumed
        if not (isinstance(p_origin, type) and isinstance(c_origin, type)):
            return True
        if c_origin is float and p_origin is int:
            return True
        if issubclass(p_origin, c_origin):
            p_args, c_args = typing.get_args(produced), typing.get_args(consumed)
            if p_args and c_args and len(p_args) == len(c_args):
                if all(hint_fits(p, c) for p, c in zip(p_args, c_args)):
                    return True
                continue
            return True
    return False


def type_name(hint: Any) -> str:
    """A readable name for a hint: ``str | list[str]``, ``Tensor``, ``Any``."""
    if hint is None:
        return "Any"
    if typing.get_origin(hint) in _UNION_TYPES:
        return " | ".join(type_name(member) for member in typing.get_args(hint))
    if typing.get_origin(hint) is not None:
        origin = typing.get_origin(hint)
        args = ", ".join(type_name(arg) for arg in typing.get_args(hint))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))
