"""The repr of an attrs class by its keywords: a field kept private (``_type_hint``, resolved when first read)
shows under the name its constructor takes (``type_hint=``), as the object was written."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["public_repr"]


def public_repr(obj: Any) -> str:
    """``Class(keyword=value, ...)`` for every field attrs would show, each by its ``alias``."""
    fields = (field for field in attrs.fields(type(obj)) if field.repr)
    return f"{type(obj).__name__}({', '.join(f'{f.alias}={getattr(obj, f.name)!r}' for f in fields)})"
