"""Quantization at load time: the config one component loads with, its backend, and what a quantized model says.

diffusers and transformers quantize a model in ``from_pretrained`` when given a config of their own library.
A pipeline holds models of both, so a request is resolved per component here: diffusers'
``PipelineQuantizationConfig`` picks the component's entry (its own resolver, as diffusers' pipelines call
it), a per-model config is checked against the model's library, and the backend package is checked before
any file is read. Nothing is converted between the libraries: their configs of one backend differ in fields
(quanto's ``weights_dtype`` vs ``weights``), so a silent conversion could quantize differently.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from .errors import QuantizationBackendError, QuantizationConfigError

__all__ = [
    "BACKEND_PACKAGES",
    "EXTRA",
    "backend_installed",
    "describe_quantization",
    "model_library",
    "quantization_method",
    "resolve_quantization",
]

#: The extra of this project that installs every backend.
EXTRA = "quantization"
#: ``quant_method`` -> (module to import, package to install), for the backends of the extra.
BACKEND_PACKAGES = {
    "torchao": ("torchao", "torchao"),
    "quanto": ("optimum.quanto", "optimum-quanto"),
    "bitsandbytes": ("bitsandbytes", "bitsandbytes"),
    "gguf": ("gguf", "gguf"),
}


def model_library(cls: type) -> str | None:
    """``"diffusers"`` or ``"transformers"`` for a model class (or auto class) of that library, else ``None``."""
    from diffusers import AutoModel, ModelMixin

    if issubclass(cls, (ModelMixin, AutoModel)):
        return "diffusers"
    try:
        from transformers import PreTrainedModel
        from transformers.models.auto.auto_factory import _BaseAutoModelClass
    except ImportError:  # pragma: no cover - transformers is a dependency; its auto base may move
        return None
    if issubclass(cls, (PreTrainedModel, _BaseAutoModelClass)):
        return "transformers"
    return None


def _config_library(config: Any) -> str | None:
    from diffusers.quantizers.quantization_config import QuantizationConfigMixin as DiffusersConfig

    if isinstance(config, DiffusersConfig):
        return "diffusers"
    try:
        from transformers.utils.quantization_config import QuantizationConfigMixin as TransformersConfig
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    return "transformers" if isinstance(config, TransformersConfig) else None


def quantization_method(config: Any) -> str | None:
    """The backend a config (or its ``to_dict()``) names, e.g. ``"torchao"``; ``None`` if it names none."""
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return None if method is None else str(getattr(method, "value", method))


def backend_installed(method: str) -> bool:
    """Whether the package of backend ``method`` (a key of ``BACKEND_PACKAGES``) can be imported."""
    module, _ = BACKEND_PACKAGES[method]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (``optimum``) is missing
        return False


def _check_backend(name: str, config: Any) -> None:
    method = quantization_method(config)
    if method not in BACKEND_PACKAGES:
        return  # another backend: its library checks it when loading
    if not backend_installed(method):
        package = BACKEND_PACKAGES[method][1]
        msg = (
            f"Component {name!r}: quantization_config uses {method}, whose package {package!r} is not installed. "
            f"Install it with `pip install {package}`, or every backend with "
            f"`pip install 'modular-pipelines[{EXTRA}]'`."
        )
        raise QuantizationBackendError(msg)


def resolve_quantization(name: str, model_class: type, config: Any) -> Any:
    """The quantization config component ``name`` of class ``model_class`` loads with, checked.

    Args:
        name: The component's name, e.g. ``"unet"``; a ``PipelineQuantizationConfig`` is looked up by it.
        model_class: The class that will load it.
        config: ``None``, a ``PipelineQuantizationConfig``, or a per-model config of diffusers or transformers.

    Returns:
        A per-model config of ``model_class``'s library, or ``None`` (not quantized: no config, a pipeline
        config that leaves this component out, or a class that loads no weights such as a tokenizer).

    Raises:
        QuantizationConfigError: ``config`` is not a quantization config, is of the other library than the
            model, is for a class of neither library, or is a GGUF config (which needs a ``.gguf`` file).
        QuantizationBackendError: the backend's package is not installed.
    """
    from diffusers.quantizers import PipelineQuantizationConfig

    from .weights import loads_weights

    if config is None or not loads_weights(model_class):
        return None
    library = model_library(model_class)
    if isinstance(config, PipelineQuantizationConfig):
        # diffusers' own per-component resolution; it treats every non-diffusers model as transformers'.
        config = config._resolve_quant_config(is_diffusers=library == "diffusers", module_name=name)
        if config is None:
            return None
    given = _config_library(config)
    where = f"{model_class.__module__}.{model_class.__qualname__}"
    if given is None:
        msg = (
            f"Component {name!r}: quantization_config must be a quantization config of diffusers or transformers "
            f"(such as diffusers.TorchAoConfig) or a diffusers PipelineQuantizationConfig (got {config!r} that is "
            f"a {type(config)}). To give each component its own, pass a dict such as "
            f"{{'{name}': config, 'default': None}} to load_components."
        )
        raise QuantizationConfigError(msg)
    if library is None:
        msg = (
            f"Component {name!r} is a {where}, a model of neither diffusers nor transformers, whose "
            f"from_pretrained does not quantize. Leave it out: quantization_config={{'{name}': None, ...}}."
        )
        raise QuantizationConfigError(msg)
    if given != library:
        msg = (
            f"Component {name!r} is a {library} model ({where}) but quantization_config is a {given} config "
            f"({type(config).__name__}). Pass {library}.{type(config).__name__}(...) for it, e.g. "
            f"quantization_config={{'{name}': <{library} config>, 'default': <{given} config>}}, or a "
            f"PipelineQuantizationConfig(quant_mapping={{...}}) holding one config per component."
        )
        raise QuantizationConfigError(msg)
    if quantization_method(config) == "gguf":
        msg = (
            f"Component {name!r}: a GGUFQuantizationConfig reads weights quantized in a .gguf file, which "
            f"from_pretrained does not load. Load the file with {model_class.__name__}.from_single_file(path, "
            f"config=<repo>, subfolder=..., quantization_config=...) and register the model with "
            f"ComponentsManager.add or pipe.update_components."
        )
        raise QuantizationConfigError(msg)
    _check_backend(name, config)
    return config


# ---- describing a quantized model ----------------------------------------------------------------------


def _weights(method: str | None, config: dict[str, Any], module: torch.nn.Module) -> str | None:
    """What the weights are stored as, in the backend's own terms (bits, dtype or scheme)."""
    if method == "torchao":
        quant_type = config.get("quant_type")
        if isinstance(
            quant_type, dict
        ):  # serialized AOBaseConfig: {"default": {"_type": "Int8WeightOnlyConfig"}}
            quant_type = next(iter(quant_type.values()), None)
        return quant_type.get("_type") if isinstance(quant_type, dict) else quant_type
    if method == "quanto":
        return config.get("weights_dtype") or config.get("weights")
    if method == "bitsandbytes":
        if config.get("load_in_4bit"):
            kind = config.get("bnb_4bit_quant_type")
            return f"4-bit {kind}" if kind else "4-bit"
        return "8-bit" if config.get("load_in_8bit") else None
    if method == "gguf":  # one file may mix types; each weight carries its own
        kinds = {getattr(param, "quant_type", None) for param in module.parameters()} - {None}
        return ", ".join(sorted(_gguf_type_name(kind) for kind in kinds)) or None
    return None


def _gguf_type_name(kind: Any) -> str:
    try:
        from gguf import GGMLQuantizationType
    except ImportError:
        return str(kind)
    return GGMLQuantizationType(kind).name


def describe_quantization(module: Any, config: Any) -> dict[str, Any]:
    """A readable summary of ``module`` quantized with ``config``.

    Returns:
        ``{"method": "torchao", "weights": "Int8WeightOnlyConfig", "skipped_modules": None}``: the backend,
        what the weights are stored as (bits, dtype or scheme; ``None`` when unknown) and the modules the
        config leaves unquantized by name (``None`` for none).
    """
    as_dict = config if isinstance(config, dict) else getattr(config, "to_dict", lambda: vars(config))()
    method = quantization_method(as_dict)
    skipped = as_dict.get("modules_to_not_convert") or as_dict.get("llm_int8_skip_modules")
    return {
        "method": method,
        "weights": _weights(method, as_dict, module) if isinstance(module, torch.nn.Module) else None,
        "skipped_modules": list(skipped) if skipped else None,
    }
