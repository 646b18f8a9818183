"""Small helpers the Stable Diffusion blocks share: sizes, guidance, VAE sampling, scheduler kwargs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import Any

import attrs
import torch

from blocks.common.guidance import guidance_scale_of
from blocks.common.vae import processor_for_vae, sample_latents, vae_scale_factor
from modular import ComponentSpec, InputParam

__all__ = [
    "MODEL_NAME",
    "SCHEDULER",
    "vae_scale_factor",
    "image_processor_for_vae",
    "default_size",
    "do_classifier_free_guidance",
    "GUIDANCE_SCALE",
    "guidance_scale",
    "guidance_scale_input",
    "encode_vae_image",
    "extra_step_kwargs",
    "repeat_to_batch",
    "strength_input",
    "with_strength_default",
    "IMG2IMG_STRENGTH",
    "INPAINT_STRENGTH",
]

MODEL_NAME = "stable-diffusion"

# The classic pipelines' strength defaults: StableDiffusionImg2ImgPipeline's and StableDiffusionInpaintPipeline's.
IMG2IMG_STRENGTH = 0.8
INPAINT_STRENGTH = 1.0

# Any diffusers scheduler works with these blocks (SD repos ship PNDM; Euler, DDIM ... can be swapped in).
SCHEDULER = ComponentSpec(
    "scheduler", "diffusers.SchedulerMixin", description="The noise scheduler (any diffusers scheduler)."
)


def image_processor_for_vae(components: Any, name: str = "image_processor") -> Any:
    """The processor component `name`, resizing to multiples of the loaded VAE's scale, as the classic pipelines."""
    return processor_for_vae(getattr(components, name), vae_scale_factor(components))


def default_size(components: Any, height: int | None, width: int | None) -> tuple[int, int]:
    """``height`` and ``width``, each defaulting to the UNet's sample size in pixels, as the classic pipelines do."""
    if height is not None and width is not None:
        return height, width
    pixels = components.unet.config.sample_size * vae_scale_factor(components)
    return height or pixels, width or pixels


GUIDANCE_SCALE = 7.5  # the classic pipelines' default, and the default guider's


def guidance_scale_input(default_guider_scale: float = GUIDANCE_SCALE) -> InputParam:
    """``guidance_scale``, defaulting to the guider's own (``guidance_scale_of``): a guider swapped in with
    ``update_components`` keeps its scale unless a call passes one."""
    return InputParam.template(
        "guidance_scale",
        default=None,
        description=(
            "Classifier-free guidance scale; 1.0 or less turns guidance off. Default: the guider's own "
            f"({default_guider_scale} for the default guider); a value given here holds for this call only."
        ),
    )


def guidance_scale(components: Any, given: float | None) -> float:
    """The call's guidance scale: `given`, else the guider's own (``guidance_scale_of``)."""
    return guidance_scale_of(components, given, GUIDANCE_SCALE)


def do_classifier_free_guidance(components: Any, guidance_scale: float) -> bool:
    """Guidance runs for a scale above 1, unless the UNet takes the scale as an embedding (LCM-style)."""
    return guidance_scale > 1 and components.unet.config.time_cond_proj_dim is None


def encode_vae_image(
    vae: Any, image: torch.Tensor, generator: torch.Generator | list[torch.Generator] | None
) -> torch.Tensor:
    """Encode pixel images [B, 3, H, W] in [-1, 1] to scaled latents.

    With a list of generators, image ``i`` is sampled with ``generator[i]`` (extra generators are unused).
    """
    return vae.config.scaling_factor * sample_latents(vae, image, generator)


@functools.lru_cache(maxsize=64)
def _step_parameters(step: Any) -> frozenset[str]:
    return frozenset(inspect.signature(step).parameters)


def extra_step_kwargs(scheduler: Any, generator: Any, eta: float) -> dict[str, Any]:
    """The optional ``eta`` and ``generator`` arguments, for the schedulers whose ``step`` takes them."""
    accepted = _step_parameters(type(scheduler).step)
    kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        kwargs["eta"] = eta
    if "generator" in accepted:
        kwargs["generator"] = generator
    return kwargs


def repeat_to_batch(tensor: torch.Tensor, batch_size: int, what: str, *, copy: bool = False) -> torch.Tensor:
    """Repeat `tensor` along dim 0 up to `batch_size`, which its batch must divide.

    With `copy`, a repeated copy even when the batch is full already (Tensor.repeat makes a VAE's
    channels-last output contiguous, and convolutions round differently per memory layout).
    """
    if tensor.shape[0] >= batch_size and not copy:
        return tensor
    if batch_size % tensor.shape[0] != 0:
        msg = (
            f"{what}: {tensor.shape[0]} given for a batch of {batch_size} (prompts x num_images_per_prompt); "
            f"the count must divide the batch, e.g. pass 1 or {batch_size}"
        )
        raise ValueError(msg)
    return tensor.repeat(batch_size // tensor.shape[0], *([1] * (tensor.dim() - 1)))


def strength_input(default: float) -> InputParam:
    """The ``strength`` input with a workflow's default (the classic pipelines differ: image-to-image 0.8,
    inpainting 1.0). Each block declares its workflow's, so a composed input records them by branch."""
    return InputParam.template(
        "strength",
        default=default,
        description="How much to transform the reference image, in [0, 1] (0 keeps it, 1 starts from pure noise).",
    )


def with_strength_default(params: Iterable[InputParam], default: float) -> list[InputParam]:
    """`params` (a block's inputs) with ``strength`` declaring `default`: an inpainting block made from an
    image-to-image one declares its own workflow's default."""
    return [attrs.evolve(p, default=default) if p.name == "strength" else p for p in params]
