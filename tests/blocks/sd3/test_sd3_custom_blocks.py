"""A user block inside the SD3 denoising loop does what the classic pipeline's step callback does."""

import torch

from blocks.sd3 import StableDiffusion3AutoBlocks
from modular import InputParam, ModularPipelineBlocks

from .conftest import COMPONENTS, classic_from


class RecordLatentsStep(ModularPipelineBlocks):
    """A user loop block: appends a copy of the latents after each step to a list the caller passes."""

    model_name = "stable-diffusion-3"

    description = "Appends latents.clone() to latents_trace after each denoising step."

    inputs = [
        InputParam("latents", type_hint=torch.Tensor, required=True),
        InputParam("latents_trace", type_hint=list, required=True, description="Receives the latents."),
    ]

    def __call__(self, components, block_state, i, t):
        block_state.latents_trace.append(block_state.latents.clone())
        return components, block_state


def test_loop_block_sees_what_the_step_callback_sees(sd3_repo, sd3_pipe):
    """The latents after each step, recorded by an inserted loop block, equal the classic callback's."""
    blocks = StableDiffusion3AutoBlocks()
    loop = blocks.sub_blocks["denoise"].sub_blocks["denoise"]
    loop.sub_blocks.insert("record", RecordLatentsStep(), len(loop.sub_blocks))
    assert list(loop.sub_blocks) == ["before_denoiser", "denoiser", "after_denoiser", "record"]
    pipe = blocks.init_pipeline(sd3_repo)
    pipe.update_components(**{name: getattr(sd3_pipe, name) for name in COMPONENTS})
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "latent"}

    ours: list[torch.Tensor] = []
    final = pipe(
        generator=torch.Generator("cpu").manual_seed(0), latents_trace=ours, output="images", **kwargs
    )
    theirs: list[torch.Tensor] = []

    def callback(pipeline, i, t, callback_kwargs):
        theirs.append(callback_kwargs["latents"].clone())
        return {}

    classic = classic_from(sd3_pipe, "text2image")
    classic(generator=torch.Generator("cpu").manual_seed(0), callback_on_step_end=callback, **kwargs)
    assert len(ours) == len(theirs) == 3
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert torch.equal(ours[-1], final)
