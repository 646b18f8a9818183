"""The values a pipeline call carries between blocks."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PipelineState", "BlockState", "summarize"]


def summarize(value: Any) -> str:
    """A short, readable description of a value: tensors as dtype and shape, long lists shortened."""
    if isinstance(value, torch.Tensor):
        return f"Tensor(dtype={value.dtype}, shape={tuple(value.shape)})"
    if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
        inner = ", ".join(summarize(v) for v in value[:3])
        more = ", ..." if len(value) > 3 else ""
        return f"{type(value).__name__}[{inner}{more}] (len={len(value)})"
    if hasattr(value, "size") and hasattr(value, "mode") and type(value).__module__.startswith("PIL"):
        return f"PIL.Image(size={value.size}, mode={value.mode})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class PipelineState:
    """Every value of one pipeline call, each optionally tagged with a kwargs_type group."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.kwargs_mapping: dict[str, list[str]] = {}

    def set(self, key: str, value: Any, kwargs_type: str | None = None) -> None:
        """Store ``value`` under ``key``; tag it with ``kwargs_type`` when given."""
        self.values[key] = value
        if kwargs_type is not None:
            keys = self.kwargs_mapping.setdefault(kwargs_type, [])
            if key not in keys:
                keys.append(key)

    def get(self, keys: str | list[str], default: Any = None) -> Any:
        """One value, or a dict of values for a list of keys; ``default`` for keys not present."""
        if isinstance(keys, str):
            return self.values.get(keys, default)
        return {key: self.values.get(key, default) for key in keys}

    def get_by_kwargs(self, kwargs_type: str) -> dict[str, Any]:
        """Every value tagged with ``kwargs_type``."""
        return {
            key: self.values[key] for key in self.kwargs_mapping.get(kwargs_type, ()) if key in self.values
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "values": dict(self.values)}

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        msg = f"PipelineState has no value {name!r}; it holds: {sorted(values)}"
        raise AttributeError(msg)

    def __repr__(self) -> str:
        lines = ["PipelineState("]
        for key, value in self.values.items():
            lines.append(f"  {key}: {summarize(value)}")
        if self.kwargs_mapping:
            lines.append("  kwargs_type groups:")
            for kind, keys in self.kwargs_mapping.items():
                lines.append(f"    {kind}: {keys}")
        lines.append(")")
        return "\n".join(lines)


class BlockState:
    """One block's view of the state: its inputs (and outputs once set) as attributes."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __getattr__(self, name: str) -> Any:
        msg = f"BlockState has no value {name!r}; it holds: {sorted(self.__dict__)}"
        raise AttributeError(msg)

    def __setattr__(self, name: str, value: Any) -> None:
        # Any name may be set: a block adds its outputs as attributes (this also tells type checkers so).
        self.__dict__[name] = value

    def __repr__(self) -> str:
        body = "".join(f"  {key}: {summarize(value)}\n" for key, value in self.__dict__.items())
        return f"BlockState(\n{body})"
