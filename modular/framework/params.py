"""Declarations of what a block reads (InputParam) and writes (OutputParam)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import attrs
import numpy as np
import PIL.Image
import torch

__all__ = ["InputParam", "OutputParam", "INPUT_TEMPLATES", "OUTPUT_TEMPLATES"]

_IMAGE = (
    PIL.Image.Image
    | list[PIL.Image.Image]
    | torch.Tensor
    | list[torch.Tensor]
    | np.ndarray
    | list[np.ndarray]
)

# Common inputs, written once so every family describes them the same way.
INPUT_TEMPLATES: dict[str, dict[str, Any]] = {
    "prompt": {
        "type_hint": str | list[str],
        "description": "The prompt or prompts to guide image generation.",
    },
    "negative_prompt": {
        "type_hint": str | list[str],
        "description": "The prompt or prompts not to guide the image generation.",
    },
    "prompt_embeds": {"type_hint": torch.Tensor, "description": "Precomputed text embeddings of the prompt."},
    "negative_prompt_embeds": {
        "type_hint": torch.Tensor,
        "description": "Precomputed text embeddings of the negative prompt.",
    },
    "height": {"type_hint": int, "description": "The height in pixels of the generated image."},
    "width": {"type_hint": int, "description": "The width in pixels of the generated image."},
    "num_inference_steps": {"type_hint": int, "default": 50, "description": "The number of denoising steps."},
    "guidance_scale": {
        "type_hint": float,
        "default": 7.5,
        "description": "Classifier-free guidance scale; 1.0 or less turns guidance off.",
    },
    "num_images_per_prompt": {
        "type_hint": int,
        "default": 1,
        "description": "The number of images to generate per prompt.",
    },
    "generator": {
        "type_hint": torch.Generator | list[torch.Generator],
        "description": "Torch generator(s) for deterministic generation.",
    },
    "latents": {"type_hint": torch.Tensor, "description": "Pre-generated noisy latents."},
    "timesteps": {"type_hint": torch.Tensor | list[int], "description": "Custom timesteps."},
    "image": {
        "type_hint": _IMAGE,
        "description": "The reference image(s) for image-to-image or inpainting.",
    },
    "mask_image": {
        "type_hint": _IMAGE,
        "description": "The mask for inpainting: white pixels are repainted, black ones kept.",
    },
    "strength": {
        "type_hint": float,
        "default": 0.8,
        "description": "How much to transform the reference image (0 keeps it, 1 ignores it).",
    },
    "output_type": {
        "type_hint": str,
        "default": "pil",
        "description": "Output format: 'pil', 'np', 'pt' or 'latent'.",
    },
    "eta": {"type_hint": float, "default": 0.0, "description": "DDIM eta; ignored by other schedulers."},
    "cross_attention_kwargs": {
        "type_hint": dict,
        "description": "Extra keyword arguments for the attention processors.",
    },
    "denoiser_input_fields": {
        "name": None,
        "kwargs_type": "denoiser_input_fields",
        "description": "Conditional inputs for the denoiser, e.g. prompt_embeds and negative_prompt_embeds.",
    },
}

OUTPUT_TEMPLATES: dict[str, dict[str, Any]] = {
    "images": {
        "type_hint": list[PIL.Image.Image] | torch.Tensor | Any,
        "description": "The generated images, in the format output_type asks for.",
    },
    "latents": {"type_hint": torch.Tensor, "description": "The denoised latents."},
    "prompt_embeds": {
        "type_hint": torch.Tensor,
        "kwargs_type": "denoiser_input_fields",
        "description": "Text embeddings of the prompt.",
    },
    "negative_prompt_embeds": {
        "type_hint": torch.Tensor,
        "kwargs_type": "denoiser_input_fields",
        "description": "Text embeddings of the negative prompt.",
    },
}


def _from_template(cls, table: dict[str, dict[str, Any]], template_name: str, note: str | None, overrides):
    if template_name not in table:
        msg = f"{cls.__name__}.template: unknown template {template_name!r}; known templates: {sorted(table)}"
        raise KeyError(msg)
    fields = {"name": template_name, **table[template_name], **overrides}
    if note:
        fields["description"] = f"{fields.get('description', '')} ({note})".strip()
    return cls(**fields)


def _check_name(instance, attribute, value):
    if value is None:
        if instance.kwargs_type is None:
            msg = f"{type(instance).__name__}: a param without a name must set kwargs_type (got name=None, kwargs_type=None)"
            raise ValueError(msg)
        return
    if not isinstance(value, str) or not value.isidentifier():
        msg = f"{type(instance).__name__}: name must be a Python identifier (got {value!r})"
        raise ValueError(msg)


_Param = TypeVar("_Param", bound=type)


def _also_a_dataclass(cls: _Param) -> _Param:
    """Give an attrs class the field table of a dataclass, so ``dataclasses.replace``, ``fields`` and ``asdict``
    work on it as on the peer's params (which are dataclasses).

    attrs keeps ``__init__`` (so ``replace`` runs the validators), equality, hashing, ``repr`` and frozenness:
    the dataclass decorator is asked for nothing but ``__dataclass_fields__``.
    """
    # In place: without slots=True the decorator returns the class it was given.
    dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    return cls


@_also_a_dataclass
@attrs.frozen(kw_only=False)
class InputParam:
    """One input a block reads from the pipeline state.

    Attributes:
        name: The state key. ``None`` together with ``kwargs_type`` collects every value tagged with
            that kwargs_type instead of one named value.
        type_hint: The expected type; checked against values the user passes to the pipeline.
        default: Used when the user does not pass the input.
        required: The pipeline refuses to run without it.
        description: One line for the generated docs.
        kwargs_type: A group tag (e.g. ``"denoiser_input_fields"``).
        metadata: Free-form extra information (e.g. for UI builders).
        defaults_by_block: Set on a composed input whose blocks declare different defaults: each block's
            default by its path from the composite (``{"inpaint": 0.9999, "img2img": 0.3}``; a nested one is
            ``"image.inpaint"``). ``default`` is then ``None``: the block that runs applies its own.
    """

    name: str | None = attrs.field(default=None, validator=_check_name)
    type_hint: Any = None
    default: Any = None
    required: bool = False
    description: str = ""
    kwargs_type: str | None = None
    metadata: dict[str, Any] | None = None
    defaults_by_block: dict[str, Any] | None = None

    @classmethod
    def template(cls, template_name: str, note: str | None = None, **overrides) -> InputParam:
        """Build a common input (``prompt``, ``height``, ``generator`` ...) with optional overrides."""
        return _from_template(cls, INPUT_TEMPLATES, template_name, note, overrides)

    def __repr__(self) -> str:
        extra = (
            ", required" if self.required else ("" if self.default is None else f", default={self.default!r}")
        )
        if self.defaults_by_block is not None:
            extra += f", defaults_by_block={self.defaults_by_block!r}"
        tag = f", kwargs_type={self.kwargs_type!r}" if self.kwargs_type else ""
        return f"InputParam({self.name!r}{extra}{tag})"


@_also_a_dataclass
@attrs.frozen(kw_only=False)
class OutputParam:
    """One value a block writes into the pipeline state."""

    name: str | None = attrs.field(default=None, validator=_check_name)
    type_hint: Any = None
    description: str = ""
    kwargs_type: str | None = None
    metadata: dict[str, Any] | None = None

    @classmethod
    def template(cls, template_name: str, note: str | None = None, **overrides) -> OutputParam:
        """Build a common output (``images``, ``latents``, ``prompt_embeds`` ...) with optional overrides."""
        return _from_template(cls, OUTPUT_TEMPLATES, template_name, note, overrides)

    def __repr__(self) -> str:
        tag = f", kwargs_type={self.kwargs_type!r}" if self.kwargs_type else ""
        return f"OutputParam({self.name!r}{tag})"
