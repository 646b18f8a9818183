"""Our SD3 blocks equal diffusers' classic SD3 pipelines bit for bit on CPU float32."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from .. import helpers
from ..helpers import STEPS, assert_identical, over_cases, seeded
from .conftest import SIZE, make_image, make_mask, run_both

TEXT2IMAGE_CASES = {
    **helpers.PROMPT_CASES,
    "no_guidance": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 1.0},
    "guidance_below_one": {"prompt": "a cat", "guidance_scale": 0.5},
    "three_prompts": {
        "prompt": "a cat",
        "prompt_2": "a red horse",
        "prompt_3": "the astronaut riding a horse",
        "negative_prompt": "blurry",
        "negative_prompt_2": "blue",
        "negative_prompt_3": "a dog",
    },
    "clip_skip_and_length": {"prompt": "a photo of a cat", "clip_skip": 2, "max_sequence_length": 16},
    "size": {"prompt": "a cat", "height": 48, "width": 32, "num_images_per_prompt": 2},
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(sd3_pipe, case, output_type):
    """Text-to-image equals StableDiffusion3Pipeline for prompts, negatives, three prompts, clip_skip, batches,
    n per prompt, no guidance and sizes."""
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **TEXT2IMAGE_CASES[case]}
    assert_identical(*run_both(sd3_pipe, "text2image", **kwargs))


SKIP_LAYER_CASES = {
    "default_window": {"num_inference_steps": 10},  # start 0.01, stop 0.2: step 1 only
    "whole_window": {
        "skip_layer_guidance_start": 0.0,
        "skip_layer_guidance_stop": 1.0,
        "num_inference_steps": 3,
    },
    "scale_and_batch": {
        "prompt": ["a cat", "a red dog"],
        "num_images_per_prompt": 2,
        "skip_guidance_layers": [0, 1],
        "skip_layer_guidance_scale": 1.5,
        "skip_layer_guidance_stop": 0.9,
        "num_inference_steps": 3,
    },
}


@pytest.mark.parametrize("case", list(SKIP_LAYER_CASES))
def test_skip_layer_guidance_parity(sd3_pipe, case):
    """Skip-layer guidance equals the classic pipeline's: a pass on the prompt with the layers skipped inside
    the start/stop window, (cond - skipped) * scale added."""
    kwargs = {"prompt": "a photo of a cat", "skip_guidance_layers": [1], "output_type": "latent"}
    kwargs.update(SKIP_LAYER_CASES[case])
    assert_identical(*run_both(sd3_pipe, "text2image", **kwargs))


def test_skip_layer_guidance_changes_the_result(sd3_pipe):
    """Skip-layer guidance takes effect (the parity cases above are not no-ops), and not without guidance."""
    kwargs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "latent", "output": "images"}
    window = {"skip_layer_guidance_start": 0.0, "skip_layer_guidance_stop": 1.0}
    plain = sd3_pipe(generator=seeded(0), **kwargs)
    skipped = sd3_pipe(generator=seeded(0), skip_guidance_layers=[1], **window, **kwargs)
    assert not torch.equal(plain, skipped)
    unguided = sd3_pipe(generator=seeded(0), guidance_scale=1.0, **kwargs)
    unguided_skipped = sd3_pipe(
        generator=seeded(0), guidance_scale=1.0, skip_guidance_layers=[1], **window, **kwargs
    )
    assert torch.equal(unguided, unguided_skipped)


@pytest.mark.parametrize("guidance_scale", [5.0, 1.0])
def test_precomputed_embeddings(sd3_pipe, guidance_scale):
    """Precomputed embeddings, pooled embeddings and negatives give what the classic pipeline gives for them."""
    embeds = helpers.random_tensors(
        3,
        prompt_embeds=(2, 93, 80),
        pooled_prompt_embeds=(2, 64),
        negative_prompt_embeds=(2, 93, 80),
        negative_pooled_prompt_embeds=(2, 64),
    )
    kwargs = {
        **embeds,
        "guidance_scale": guidance_scale,
        "num_inference_steps": STEPS,
        "output_type": "latent",
    }
    assert_identical(*run_both(sd3_pipe, "text2image", **kwargs))


def test_precomputed_embeddings_without_negatives(sd3_pipe):
    """With prompt_embeds alone and guidance, the empty negative prompt is encoded per prompt, as the classic."""
    embeds = helpers.random_tensors(4, prompt_embeds=(2, 333, 80), pooled_prompt_embeds=(2, 64))
    assert_identical(
        *run_both(sd3_pipe, "text2image", num_inference_steps=STEPS, output_type="latent", **embeds)
    )


def test_given_latents_and_generator_list(sd3_pipe):
    """Given latents (no generator), then one generator per image, give the classic result."""
    helpers.assert_latents_and_generator_list(run_both, sd3_pipe, (2, 16, SIZE // 2, SIZE // 2))


def test_default_size_and_pil_output(sd3_pipe):
    """Without height and width, both make the transformer's sample size in pixels; 'pil' gives the classic pixels."""
    ours, theirs = run_both(sd3_pipe, "text2image", prompt="a cat", num_inference_steps=1)
    helpers.assert_identical_pil(ours, theirs, size=(SIZE, SIZE))


@pytest.mark.parametrize(
    "timesteps",
    [{"sigmas": [1.0, 0.7, 0.3]}, {"mu": 0.8}, {"dynamic": True}, {"dynamic": True, "mu": 1.2}],
    ids=["sigmas", "mu", "dynamic_shift", "dynamic_shift_given_mu"],
)
@pytest.mark.parametrize("workflow", ["text2image", "image2image"])
def test_custom_sigmas_mu_and_dynamic_shifting(sd3_pipe, timesteps, workflow):
    """Custom sigmas, a given mu and an SD 3.5-style dynamically shifting scheduler give the classic timesteps."""
    timesteps = dict(timesteps)
    original = sd3_pipe.scheduler
    if timesteps.pop("dynamic", False):
        config = {**original.config, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15}
        sd3_pipe.update_components(scheduler=FlowMatchEulerDiscreteScheduler.from_config(config))
    image = {"image": make_image(), "strength": 0.9} if workflow == "image2image" else {}
    try:
        kwargs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "latent", **image, **timesteps}
        assert_identical(*run_both(sd3_pipe, workflow, **kwargs))
    finally:
        sd3_pipe.update_components(scheduler=original)


def test_repo_without_t5(sd3_no_t5_repo):
    """A repo without T5 (text_encoder_3 null) runs, with zeros in T5's place, as the classic pipeline."""
    pipe = helpers.ParityHarness.load_pipeline(_harness(), sd3_no_t5_repo)
    assert pipe.text_encoder_3 is None
    kwargs = {"prompt": ["a cat", "a dog"], "negative_prompt": "blurry", "num_inference_steps": STEPS}
    assert_identical(*run_both(pipe, "text2image", output_type="np", max_sequence_length=8, **kwargs))
    assert_identical(*run_both(pipe, "image2image", image=make_image(), output_type="latent", **kwargs))


def _harness():
    from .conftest import SD3

    return SD3


IMAGE2IMAGE_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "strength": {"prompt": "a photo of a cat", "strength": 0.8, "num_inference_steps": 4},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2, "strength": 1.0},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"], "strength": 0.9},
    "no_guidance": {"prompt": "a cat", "guidance_scale": 1.0, "strength": 0.9},
    "size": {"prompt": "a cat", "height": 48, "width": 32, "strength": 0.9},
}


@over_cases(IMAGE2IMAGE_CASES)
def test_image2image_parity(sd3_pipe, case, output_type):
    """Image-to-image equals StableDiffusion3Img2ImgPipeline, including the default strength (0.6)."""
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **IMAGE2IMAGE_CASES[case]}
    assert_identical(*run_both(sd3_pipe, "image2image", image=make_image(), **kwargs))


def test_image2image_generator_list_and_latent_image(sd3_pipe):
    """One generator per image (with one image per output: the classic pipeline encodes image i with generator
    i, and fails on one image for two), and an image given as latents (16 channels), give the classic result."""
    kwargs = {"prompt": "a cat", "num_images_per_prompt": 2, "num_inference_steps": STEPS, "strength": 0.9}
    kwargs["output_type"] = "latent"
    images = [make_image(), make_image(1)]
    assert_identical(*run_both(sd3_pipe, "image2image", seed=(1, 2), image=images, **kwargs))
    latents = torch.randn(1, 16, SIZE // 2, SIZE // 2, generator=seeded(4))
    assert_identical(*run_both(sd3_pipe, "image2image", image=latents, **kwargs))


INPAINT_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "full_strength": {"prompt": "a photo of a cat", "strength": 1.0},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2, "strength": 0.9},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": "blurry", "strength": 0.8},
    "no_guidance": {"prompt": "a cat", "guidance_scale": 1.0, "strength": 0.9},
}


@over_cases(INPAINT_CASES)
@pytest.mark.parametrize("transformer", ["latents_only", "inpainting"])
def test_inpainting_parity(sd3_pipe, sd3_inpaint_pipe, transformer, case, output_type):
    """Inpainting equals StableDiffusion3InpaintPipeline with a 16-channel transformer (the kept area pasted back
    each step) and a 33-channel inpainting transformer (mask and masked image read beside the latents)."""
    pipe = sd3_inpaint_pipe if transformer == "inpainting" else sd3_pipe
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **INPAINT_CASES[case]}
    assert_identical(*run_both(pipe, "inpainting", image=make_image(), mask_image=make_mask(), **kwargs))


@pytest.mark.parametrize("transformer", ["latents_only", "inpainting"])
def test_inpainting_inputs(sd3_pipe, sd3_inpaint_pipe, transformer):
    """Given masked_image_latents, given latents and one generator per image give the classic result."""
    pipe = sd3_inpaint_pipe if transformer == "inpainting" else sd3_pipe
    base = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "num_inference_steps": STEPS}
    base.update(output_type="latent", strength=0.9)
    masked = torch.randn(1, 16, SIZE // 2, SIZE // 2, generator=seeded(6))
    assert_identical(*run_both(pipe, "inpainting", masked_image_latents=masked, **base))
    latents = torch.randn(1, 16, SIZE // 2, SIZE // 2, generator=seeded(7))
    assert_identical(*run_both(pipe, "inpainting", latents=latents, **base))
    assert_identical(*run_both(pipe, "inpainting", seed=(1, 2), num_images_per_prompt=2, **base))


def test_inpainting_padding_mask_crop(sd3_pipe):
    """padding_mask_crop crops image and mask to the masked area and pastes the result back, as the classic."""
    image, mask = helpers.make_image(1, 64), helpers.make_mask(64)
    kwargs = {"prompt": "a cat", "image": image, "mask_image": mask, "padding_mask_crop": 4, "strength": 0.9}
    ours, theirs = run_both(sd3_pipe, "inpainting", num_inference_steps=STEPS, height=32, width=32, **kwargs)
    helpers.assert_identical_pil(ours, theirs, size=(64, 64))
