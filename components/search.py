"""Name patterns for ``ComponentsManager.search_components``: ``a|b``, leading ``!``, ``x*``, ``*x``, ``*x*``."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["compile_pattern"]


def _term_matcher(term: str, pattern: str) -> Callable[[str], bool]:
    if not term:
        msg = f"Search pattern {pattern!r} has an empty term; write names separated by '|', e.g. 'unet|vae'."
        raise ValueError(msg)
    if term == "*":
        return lambda name: True
    starts, ends = term.startswith("*"), term.endswith("*")
    core = term.strip("*")
    if "*" in core:
        msg = f"Search pattern {pattern!r}: '*' may only open or close a term (got {term!r})."
        raise ValueError(msg)
    if starts and ends:
        return lambda name: core in name
    if ends:
        return lambda name: name.startswith(core)
    if starts:
        return lambda name: name.endswith(core)
    return lambda name: name == core


def compile_pattern(pattern: str) -> Callable[[str], bool]:
    """Turns a search pattern into a predicate on component names.

    Grammar: an optional leading ``!`` negates the whole pattern; ``|`` separates alternatives; each
    alternative is ``name`` (exact), ``name*`` (prefix), ``*name`` (suffix) or ``*name*`` (contains).

    Raises:
        TypeError: ``pattern`` is not a str.
        ValueError: the pattern is empty or malformed.
    """
    if not isinstance(pattern, str):
        msg = f"Search pattern must be a str such as 'unet|vae' (got {pattern!r} that is a {type(pattern)})."
        raise TypeError(msg)
    negate = pattern.startswith("!")
    body = pattern[1:] if negate else pattern
    matchers = [_term_matcher(term, pattern) for term in body.split("|")]

    def predicate(name: str) -> bool:
        return any(matcher(name) for matcher in matchers) != negate

    return predicate
