"""Steps and rules that several families share.

One module per concept: ``params`` (inputs and outputs the blocks hand each other), ``batch`` (the
batch of prompts x images per prompt: generators, repeats), ``prompts``, ``vae`` (scale, encoding and
its normalizations), ``timesteps`` (the flow-matching shift, image-to-image's cut by strength),
``inputs`` (the step that repeats embeddings per image), ``checks`` and ``image_checks`` (rules for a
call's inputs), ``denoise_loop``, ``decode``, ``workflows`` (the stages every family assembles) and
``tiny`` (pieces of the tiny-repo builders).
"""

from .checks import OUTPUT_TYPES, CheckInputsStep, InputProblems
from .decode import VaeDecodeStep
from .denoise_loop import SchedulerStepAfterDenoiser, TimestepLoopBlocks
from .vae import processor_for_vae, retrieve_latents, vae_scale_factor

__all__ = [
    "OUTPUT_TYPES",
    "CheckInputsStep",
    "InputProblems",
    "SchedulerStepAfterDenoiser",
    "TimestepLoopBlocks",
    "VaeDecodeStep",
    "processor_for_vae",
    "retrieve_latents",
    "vae_scale_factor",
]
