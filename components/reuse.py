"""Load options that decide whether a registered component can stand in for a new load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from .model_info import module_dtype, quantization_config
from .spec import normalize_dtype

__all__ = ["LoadOptions"]


def _canonical_quantization(config: Any) -> str | None:
    """A per-model quantization config (resolved: ``components.quantization.resolve_quantization``) as JSON.

    The whole ``to_dict()`` with the config's class: ``to_diff_dict()`` leaves out values equal to the class
    defaults, ``quant_method`` among them, so configs of two backends could read alike.
    """
    if config is None:
        return None
    as_dict = config.to_dict() if hasattr(config, "to_dict") else config
    kind = f"{type(config).__module__}.{type(config).__qualname__}"
    return json.dumps({"config_class": kind, "config": as_dict}, sort_keys=True, default=str)


@attrs.frozen
class LoadOptions:
    """The options of a load that change the resulting object: dtype and quantization.

    Attributes:
        dtype: The requested dtype as a string (``"torch.float16"``), or ``None`` for the library default.
        quantization: The component's own quantization config (a pipeline-wide one resolved for it) as
            canonical JSON, or ``None``.
    """

    dtype: str | None = None
    quantization: str | None = None

    @classmethod
    def from_request(cls, options: Mapping[str, Any]) -> LoadOptions:
        """Reads the options of a ``load``/``get_or_load`` call, its ``quantization_config`` already resolved for
        the component (``ComponentSpec.resolve_quantization``)."""
        dtype = normalize_dtype(options.get("dtype"), options.get("torch_dtype"))
        return cls(
            dtype=None if dtype is None else str(dtype),
            quantization=_canonical_quantization(options.get("quantization_config")),
        )

    @classmethod
    def from_object(cls, component: Any) -> LoadOptions:
        """Describes an object registered by hand: no requested dtype, its actual quantization."""
        quantization = quantization_config(component) if isinstance(component, torch.nn.Module) else None
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
