"""A user block inside the Qwen-Image denoising loop does what the classic pipeline's step callback does."""

import pytest
import torch

from blocks.qwenimage import QwenImageAutoBlocks
from modular import InputParam, ModularPipelineBlocks

from .conftest import COMPONENTS, SIZE, classic_from, make_image, make_mask


class RecordLatentsStep(ModularPipelineBlocks):
    """A user loop block: appends a copy of the latents after each step to a list the caller passes."""

    model_name = "qwen-image"

    description = "Appends latents.clone() to latents_trace after each denoising step."

    inputs = [
        InputParam("latents", type_hint=torch.Tensor, required=True),
        InputParam("latents_trace", type_hint=list, required=True, description="Receives the latents."),
    ]

    def __call__(self, components, block_state, i, t):
        block_state.latents_trace.append(block_state.latents.clone())
        return components, block_state


@pytest.mark.parametrize(
    ("workflow", "loop_name", "extra"),
    [
        ("text2image", "denoise", {}),
        (
            "inpainting",
            "inpaint_denoise",
            {"image": make_image(), "mask_image": make_mask(), "strength": 1.0},
        ),
    ],
)
def test_loop_block_sees_what_the_step_callback_sees(qwen_repo, qwen_pipe, workflow, loop_name, extra):
    """The latents after each step (inpainting's after the blend), recorded by an inserted loop block, equal the
    classic callback's."""
    blocks = QwenImageAutoBlocks()
    loop = blocks.sub_blocks["denoise"].sub_blocks[loop_name]
    loop.sub_blocks.insert("record", RecordLatentsStep(), len(loop.sub_blocks))
    assert list(loop.sub_blocks) == ["before_denoiser", "denoiser", "after_denoiser", "record"]
    pipe = blocks.init_pipeline(qwen_repo)
    pipe.update_components(**{name: getattr(qwen_pipe, name) for name in COMPONENTS})
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "negative_prompt": "blurry", "height": SIZE, "width": SIZE, **extra}
    kwargs.update(num_inference_steps=3, output_type="latent")

    ours: list[torch.Tensor] = []
    final = pipe(
        generator=torch.Generator("cpu").manual_seed(0), latents_trace=ours, output="images", **kwargs
    )
    theirs: list[torch.Tensor] = []

    def callback(pipeline, i, t, callback_kwargs):
        theirs.append(callback_kwargs["latents"].clone())
        return {}

    classic = classic_from(qwen_pipe, workflow)
    classic(generator=torch.Generator("cpu").manual_seed(0), callback_on_step_end=callback, **kwargs)
    assert len(ours) == len(theirs) == 3
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert torch.equal(ours[-1], final)
