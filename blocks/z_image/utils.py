"""Small helpers the Z-Image blocks share: component specs, sizes, the default sigmas, guidance."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.guidance import guidance_scale_of
from blocks.common.vae import processor_for_vae, vae_scale_factor
from modular import ComponentSpec, InputParam

__all__ = [
    "MODEL_NAME",
    "SCHEDULER",
    "IMAGE_PROCESSOR",
    "DEFAULT_SIZE",
    "GUIDANCE_SCALE",
    "image_processor_for_vae",
    "resolve_size",
    "default_sigmas",
    "do_classifier_free_guidance",
    "guidance_scale",
    "guidance_scale_input",
    "embeds_input",
]

MODEL_NAME = "z-image"

# Flow matching: the scheduler takes custom sigmas and the resolution-dependent shift `mu`.
SCHEDULER = ComponentSpec(
    "scheduler",
    "diffusers.FlowMatchEulerDiscreteScheduler",
    description="The flow-matching scheduler (takes custom sigmas and a shift mu).",
)

# Z-Image's VAE has 4 levels (8 pixels per latent cell) and the transformer patches 2x2 latent cells,
# so images are handled in multiples of 16 pixels. Made from config before the VAE is known, so the
# blocks resize with the loaded VAE's scale instead (image_processor_for_vae), as the classic pipelines.
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 16},
    default_creation_method="from_config",
)

# The classic text-to-image pipeline's default height and width.
DEFAULT_SIZE = 1024


def image_processor_for_vae(components: Any) -> Any:
    """The image processor, resizing to multiples of twice the loaded VAE's scale, as the classic pipelines."""
    return processor_for_vae(components.image_processor, vae_scale_factor(components) * 2)


def resolve_size(block: Any, components: Any, height: int | None, width: int | None) -> tuple[int, int]:
    """``height`` and ``width`` (each 1024 when not given), checked to be multiples of VAE scale x 2."""
    height = DEFAULT_SIZE if height is None else height
    width = DEFAULT_SIZE if width is None else width
    multiple = vae_scale_factor(components) * 2
    for name, value in (("height", height), ("width", width)):
        if value % multiple != 0:
            msg = (
                f"{type(block).__name__}: {name} must be a multiple of {multiple} (the VAE scale x the "
                f"transformer's 2x2 patches; got {value}); pass e.g. {name}={max(multiple, value // multiple * multiple)}"
            )
            raise ValueError(msg)
    return height, width


def default_sigmas(num_inference_steps: int) -> list[float]:
    """Z-Image's default schedule: sigmas evenly spaced from 1 down to 1 / num_inference_steps."""
    return torch.linspace(1.0, 1 / num_inference_steps, num_inference_steps).tolist()


GUIDANCE_SCALE = 5.0  # the classic pipelines' default


def guidance_scale_input() -> InputParam:
    """``guidance_scale`` with Z-Image's meaning (0 turns guidance off), defaulting to the guider's own (5.0 for
    the default guider; ``guidance_scale``)."""
    return InputParam.template(
        "guidance_scale",
        default=None,
        description=(
            "Classifier-free guidance scale: pred = pos + scale * (pos - neg); 0 turns guidance off. Default: "
            f"the guider's own ({GUIDANCE_SCALE} for the default guider); a value given here holds for this call only."
        ),
    )


def guidance_scale(components: Any, given: float | None) -> float:
    """The call's guidance scale: `given`, else the guider's own (``guidance_scale_of``)."""
    return guidance_scale_of(components, given, GUIDANCE_SCALE)


def do_classifier_free_guidance(guidance_scale: float) -> bool:
    """Z-Image runs guidance for any scale above 0 (its guidance adds scale x (pos - neg) to pos)."""
    return guidance_scale > 0


def embeds_input(name: str, required: bool = False, note: str | None = None) -> InputParam:
    """``prompt_embeds`` / ``negative_prompt_embeds``: Z-Image takes one [seq_len, dim] tensor per prompt,
    each as long as its prompt's tokens (no padding), so the embeddings are a list."""
    return InputParam.template(
        name,
        note,
        type_hint=list[torch.Tensor],
        required=required,
    )
