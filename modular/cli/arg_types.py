"""The command line's value types: what argparse turns an option's text into, refusing bad text at parse time."""

from __future__ import annotations

import argparse

from modular.batch.job_values import seed_problem
from offload.devices.units import parse_bytes

__all__ = [
    "byte_size",
    "gpu_share",
    "names",
    "non_negative_int",
    "non_negative_number",
    "port_number",
    "positive_int",
    "positive_number",
    "replica_range",
    "seed_number",
]


def _whole_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        kind = "positive whole number" if least == 1 else "whole number"
        raise argparse.ArgumentTypeError(f"must be a {kind} (got {text!r})") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least} (got {value})")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _whole_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _whole_at_least(text, 0)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 (0: a free one)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        msg = f"must be a port from 0 to 65535 (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        msg = f"must be a number (got {text!r})"
        raise argparse.ArgumentTypeError(msg) from None


def positive_number(text: str) -> float:
    """An argparse type: a number more than 0 (seconds, say)."""
    value = _number(text)
    if not value > 0 or value == float("inf"):
        msg = f"must be a finite number more than 0 (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


def non_negative_number(text: str) -> float:
    """An argparse type: a finite number of at least 0."""
    value = _number(text)
    if not value >= 0 or value == float("inf"):
        msg = f"must be a finite number of at least 0 (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


def gpu_share(text: str) -> float:
    """An argparse type: GPUs of one Ray replica, a fraction from 0 to 1 (0.5: two replicas share one) or a
    whole number."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf") or (value > 1 and not value.is_integer()):
        msg = f"must be a number from 0 to 1, or a whole number of GPUs (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value


def replica_range(text: str) -> tuple[int, int]:
    """An argparse type: ``MIN:MAX`` replicas, whole numbers with 1 <= MIN <= MAX."""
    low, colon, high = text.partition(":")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = (0, 0)
    if not colon or not 1 <= bounds[0] <= bounds[1]:
        msg = f"must be MIN:MAX replicas, whole numbers with 1 <= MIN <= MAX, e.g. 1:4 (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return bounds


def seed_number(text: str) -> int:
    """An argparse type: a generator seed, a whole number from 0 to 2**63-1."""
    try:
        value = int(text)
    except ValueError:
        msg = f"must be a whole number (got {text!r})"
        raise argparse.ArgumentTypeError(msg) from None
    problem = seed_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        msg = f"must name components, e.g. text_encoder,vae (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return names


def byte_size(text: str) -> int:
    """An argparse type: a size such as ``8GB``, ``512MB`` or ``1.5GiB``."""
    try:
        return parse_bytes(text, name="a size")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
