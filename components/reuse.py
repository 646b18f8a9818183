"""Load options that decide whether a registered component can stand in for a new load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from .model_info import module_dtype, quantization_info
from .spec import normalize_dtype

__all__ = ["LoadOptions"]


def _canonical_quantization(config: Any) -> str | None:
    if config is None:
        return None
    if hasattr(config, "to_diff_dict"):
        config = config.to_diff_dict()
    elif hasattr(config, "to_dict"):
        config = config.to_dict()
    return json.dumps(config, sort_keys=True, default=str)


@attrs.frozen
class LoadOptions:
    """The options of a load that change the resulting object: dtype and quantization.

    Attributes:
        dtype: The requested dtype as a string (``"torch.float16"``), or ``None`` for the library default.
        quantization: The quantization config as canonical JSON, or ``None``.
    """

    dtype: str | None = None
    quantization: str | None = None

    @classmethod
    def from_request(cls, options: Mapping[str, Any]) -> LoadOptions:
        """Reads the options of a ``load``/``get_or_load`` call."""
        dtype = normalize_dtype(options.get("dtype"), options.get("torch_dtype"))
        return cls(
            dtype=None if dtype is None else str(dtype),
            quantization=_canonical_quantization(options.get("quantization_config")),
        )

    @classmethod
    def from_object(cls, component: Any) -> LoadOptions:
        """Describes an object registered by hand: no requested dtype, its actual quantization."""
        quantization = quantization_info(component) if isinstance(component, torch.nn.Module) else None
        return cls(dtype=None, quantization=_canonical_quantization(quantization))

    def serves(self, requested: LoadOptions, component: Any) -> bool:
        """Whether a component registered with these options can serve a request with ``requested``.

        Quantization must be equal. A requested dtype matches when it was requested the same way, or when the
        module already has that dtype; objects without weights (tokenizers, schedulers) ignore dtype.
        """
        if self.quantization != requested.quantization:
            return False
        if not isinstance(component, torch.nn.Module) or self.dtype == requested.dtype:
            return True
        if requested.dtype is None:
            return False
        return str(module_dtype(component)) == requested.dtype
