"""Our Stable Diffusion blocks equal diffusers' classic pipelines bit for bit on CPU float32."""

import pytest
import torch
from diffusers import DDIMScheduler, EulerDiscreteScheduler

from blocks.common import vae_scale_factor

from .. import helpers
from ..helpers import STEPS, assert_identical, make_image, make_mask, over_cases, seeded
from .conftest import run_both

TEXT2IMAGE_CASES = {
    **helpers.PROMPT_CASES,
    **helpers.UNET_TEXT2IMAGE_CASES,
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(sd_pipe, case, output_type):
    """Text-to-image equals StableDiffusionPipeline for prompts, negatives, batches, n per prompt and no CFG."""
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **TEXT2IMAGE_CASES[case]}
    assert_identical(*run_both(sd_pipe, "text2image", **kwargs))


@pytest.mark.parametrize("guidance_scale", [7.5, 1.0])
def test_text2image_precomputed_embeddings(sd_pipe, guidance_scale):
    """Precomputed prompt_embeds and negative_prompt_embeds give what the classic pipeline gives for them."""
    embeds = helpers.random_tensors(3, prompt_embeds=(2, 77, 32), negative_prompt_embeds=(2, 77, 32))
    kwargs = {"guidance_scale": guidance_scale, "num_images_per_prompt": 2, "num_inference_steps": STEPS}
    assert_identical(*run_both(sd_pipe, "text2image", output_type="latent", **embeds, **kwargs))


def test_clip_skip(sd_pipe):
    """clip_skip=1 conditions on the final-layer-normed second-to-last CLIP layer (the negative is not skipped)."""
    text_encoder, tokenizer = sd_pipe.text_encoder, sd_pipe.tokenizer
    ids = tokenizer(
        "a cat", padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        hidden = text_encoder(ids, output_hidden_states=True).hidden_states[-2]
        skipped = text_encoder.final_layer_norm(hidden)
    kwargs = {"num_inference_steps": STEPS, "output_type": "latent", "output": "images"}
    ours = sd_pipe(prompt="a cat", clip_skip=1, generator=seeded(0), **kwargs)
    plain = sd_pipe(prompt="a cat", generator=seeded(0), **kwargs)
    expected, theirs = run_both(
        sd_pipe, "text2image", prompt_embeds=skipped, num_inference_steps=STEPS, output_type="latent"
    )
    assert_identical(ours, expected)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, plain)


def test_text2image_given_latents_and_generator_list(sd_pipe):
    """Given latents are used as the start; a list of generators (one per image) gives the classic result."""
    helpers.assert_latents_and_generator_list(run_both, sd_pipe, (2, 4, 32, 32))


IMAGE2IMAGE_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "strength": {"prompt": "a photo of a cat", "strength": 0.6, "num_inference_steps": 4},
    "two_per_prompt": {
        "prompt": "a cat",
        "num_images_per_prompt": 2,
        "num_inference_steps": STEPS,
        "strength": 1.0,
    },
    "two_prompts": {"prompt": ["a cat", "a red dog"], "num_inference_steps": STEPS, "strength": 1.0},
    "no_guidance": {"prompt": ["a cat", "a red dog"], "guidance_scale": 1.0, "num_inference_steps": STEPS},
}


@over_cases(IMAGE2IMAGE_CASES)
def test_image2image_parity(sd_pipe, case, output_type):
    """Image-to-image equals StableDiffusionImg2ImgPipeline, including the default strength (0.8)."""
    kwargs = {"image": make_image(), "output_type": output_type, **IMAGE2IMAGE_CASES[case]}
    assert_identical(*run_both(sd_pipe, "image2image", **kwargs))


def test_image2image_generator_list(sd_pipe):
    """With one generator per image, each repeated reference image is encoded with its own generator."""
    kwargs = {"prompt": "a cat", "image": make_image(), "num_images_per_prompt": 2, "num_inference_steps": 3}
    assert_identical(*run_both(sd_pipe, "image2image", seed=(1, 2), output_type="latent", **kwargs))


INPAINT_CASES = {
    "default_strength": {"prompt": "a photo of a cat"},
    "strength": {"prompt": "a photo of a cat", "strength": 0.75, "num_inference_steps": 4},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"]},
    "no_guidance": {"prompt": ["a cat", "a red dog"], "guidance_scale": 1.0},
}


@over_cases(INPAINT_CASES)
@pytest.mark.parametrize("unet_channels", [9, 4])
def test_inpainting_parity(sd_pipe, sd_inpaint_pipe, unet_channels, case, output_type):
    """Inpainting equals StableDiffusionInpaintPipeline for a 9-channel and a 4-channel (blended) UNet."""
    pipe = sd_inpaint_pipe if unet_channels == 9 else sd_pipe
    assert pipe.unet.config.in_channels == unet_channels
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **INPAINT_CASES[case]}
    assert_identical(*run_both(pipe, "inpainting", image=make_image(), mask_image=make_mask(), **kwargs))


@pytest.mark.parametrize("scheduler_class", [EulerDiscreteScheduler, DDIMScheduler])
def test_parity_with_other_schedulers(sd_pipe, scheduler_class):
    """With Euler (sigma scaling, begin index) or DDIM (eta, generator) swapped in, all three workflows match."""
    original = sd_pipe.scheduler
    sd_pipe.update_components(scheduler=scheduler_class.from_config(original.config))
    try:
        workflows = {
            "text2image": {},
            "image2image": {"image": make_image(), "num_inference_steps": 3},
            "inpainting": {"image": make_image(), "mask_image": make_mask(), "strength": 0.9},
        }
        for workflow, extra in workflows.items():
            kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **extra}
            if scheduler_class is DDIMScheduler:
                kwargs["eta"] = 0.5
            assert_identical(*run_both(sd_pipe, workflow, **kwargs))
    finally:
        sd_pipe.update_components(scheduler=original)


def test_pil_output(sd_pipe):
    """output_type='pil' (the default) gives PIL images with the classic pipeline's pixels."""
    ours, theirs = run_both(sd_pipe, "text2image", prompt="a cat", num_inference_steps=STEPS)
    helpers.assert_identical_pil(ours, theirs, size=(64, 64))


def test_guidance_embedding_unet_parity(sd_pipe):
    """A UNet with time_cond_proj_dim (LCM-style) gets the guidance embedding and no CFG, as in the classic."""
    config = dict(sd_pipe.unet.config)
    config["time_cond_proj_dim"] = 32
    torch.manual_seed(0)
    unet = type(sd_pipe.unet).from_config(config).eval()
    original = sd_pipe.unet
    sd_pipe.update_components(unet=unet)
    try:
        kwargs = {"guidance_scale": 5.0, "num_images_per_prompt": 2, "num_inference_steps": STEPS}
        assert_identical(*run_both(sd_pipe, "text2image", prompt="a cat", output_type="latent", **kwargs))
    finally:
        sd_pipe.update_components(unet=original)


SIZED_44X36 = {
    "image2image": {"image": make_image(size=44, height=36)},
    "inpainting": {"image": make_image(size=50), "mask_image": make_mask(size=50), "height": 36, "width": 44},
}


def assert_44x36_as_the_classic(pipe, workflows):
    """Each workflow on SIZED_44X36's inputs makes a 44x36 image equal to the classic pipeline's."""
    for workflow in workflows:
        helpers.assert_makes_44x36_as_the_classic(run_both, pipe, workflow, **SIZED_44X36[workflow])


@pytest.mark.parametrize("unet_channels", [9, 4])
def test_sizes_follow_the_vae_scale_not_8(sd_pipe, sd_inpaint_pipe, unet_channels):
    """With a VAE of scale 2, a 44x36 image keeps its size in image-to-image, and inpainting makes 44x36,
    as in the classic pipelines (an image processor fixed at 8 made 40x32)."""
    pipe = sd_inpaint_pipe if unet_channels == 9 else sd_pipe
    assert vae_scale_factor(pipe) == 2
    assert_44x36_as_the_classic(pipe, ["image2image", "inpainting"] if unet_channels == 4 else ["inpainting"])


def test_image_processor_takes_the_scale_of_a_3_level_vae(sd_vae4_pipe):
    """With a VAE of scale 4, image-to-image and inpainting keep 44x36 and equal the classic pipelines."""
    assert vae_scale_factor(sd_vae4_pipe) == 4
    assert_44x36_as_the_classic(sd_vae4_pipe, ["image2image", "inpainting"])
