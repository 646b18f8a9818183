"""Steps and rules that several families share."""

from .checks import OUTPUT_TYPES, CheckInputsStep, InputProblems
from .decode import VaeDecodeStep
from .denoise_loop import TimestepLoopBlocks
from .vae import processor_for_vae, retrieve_latents, vae_scale_factor

__all__ = [
    "OUTPUT_TYPES",
    "CheckInputsStep",
    "InputProblems",
    "TimestepLoopBlocks",
    "VaeDecodeStep",
    "processor_for_vae",
    "retrieve_latents",
    "vae_scale_factor",
]
