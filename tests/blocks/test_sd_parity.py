"""Our Stable Diffusion blocks equal diffusers' classic pipelines bit for bit on CPU float32."""

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, EulerDiscreteScheduler

from blocks.common import vae_scale_factor

from .conftest import classic_from, make_image, make_mask

STEPS = 2


def run_both(pipe, workflow, seed=0, **kwargs):
    """Run ours and the classic pipeline with the same inputs and a fresh generator of the same seed each."""
    classic = classic_from(pipe, workflow)
    theirs = classic(generator=torch.Generator("cpu").manual_seed(seed), **kwargs).images
    ours = pipe(generator=torch.Generator("cpu").manual_seed(seed), output="images", **kwargs)
    return ours, theirs


def assert_identical(ours, theirs):
    """torch.equal on tensors and on numpy arrays (as tensors)."""
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray)
        ours, theirs = torch.from_numpy(ours), torch.from_numpy(theirs)
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


TEXT2IMAGE_CASES = {
    "guided": {"prompt": "a photo of a cat"},
    "negative_prompt": {"prompt": "a photo of a cat", "negative_prompt": "blurry"},
    "two_per_prompt": {"prompt": "a photo of a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a photo of a cat", "a red dog"], "negative_prompt": ["blurry", "blue"]},
    "no_guidance": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 1.0},
    "guidance_rescale": {"prompt": "a cat", "guidance_rescale": 0.7, "num_images_per_prompt": 2},
    "size": {"prompt": "a cat", "height": 48, "width": 32},
}


@pytest.mark.parametrize("output_type", ["latent", "np"])
@pytest.mark.parametrize("case", list(TEXT2IMAGE_CASES))
def test_text2image_parity(sd_pipe, case, output_type):
    """Text-to-image equals StableDiffusionPipeline for prompts, negatives, batches, n per prompt and no CFG."""
    ours, theirs = run_both(
        sd_pipe, "text2image", num_inference_steps=STEPS, output_type=output_type, **TEXT2IMAGE_CASES[case]
    )
    assert_identical(ours, theirs)


@pytest.mark.parametrize("guidance_scale", [7.5, 1.0])
def test_text2image_precomputed_embeddings(sd_pipe, guidance_scale):
    """Precomputed prompt_embeds and negative_prompt_embeds give what the classic pipeline gives for them."""
    generator = torch.Generator("cpu").manual_seed(3)
    prompt_embeds = torch.randn(2, 77, 32, generator=generator)
    negative_prompt_embeds = torch.randn(2, 77, 32, generator=generator)
    ours, theirs = run_both(
        sd_pipe,
        "text2image",
        prompt_embeds=prompt_embeds,
        negative_prompt_embeds=negative_prompt_embeds,
        guidance_scale=guidance_scale,
        num_images_per_prompt=2,
        num_inference_steps=STEPS,
        output_type="latent",
    )
    assert_identical(ours, theirs)


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
    ours = sd_pipe(prompt="a cat", clip_skip=1, generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    plain = sd_pipe(prompt="a cat", generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    expected = sd_pipe(prompt_embeds=skipped, generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    theirs = classic_from(sd_pipe, "text2image")(
        prompt_embeds=skipped,
        num_inference_steps=STEPS,
        output_type="latent",
        generator=torch.Generator("cpu").manual_seed(0),
    ).images
    assert_identical(ours, expected)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, plain)


def test_text2image_given_latents_and_generator_list(sd_pipe):
    """Given latents are used as the start; a list of generators (one per image) gives the classic result."""
    latents = torch.randn(2, 4, 32, 32, generator=torch.Generator("cpu").manual_seed(5))
    kwargs = {
        "prompt": "a cat",
        "num_images_per_prompt": 2,
        "num_inference_steps": STEPS,
        "output_type": "np",
    }
    theirs = classic_from(sd_pipe, "text2image")(latents=latents, **kwargs).images
    ours = sd_pipe(latents=latents, output="images", **kwargs)
    assert_identical(ours, theirs)
    generators = [torch.Generator("cpu").manual_seed(s) for s in (1, 2)]
    theirs = classic_from(sd_pipe, "text2image")(generator=generators, **kwargs).images
    generators = [torch.Generator("cpu").manual_seed(s) for s in (1, 2)]
    ours = sd_pipe(generator=generators, output="images", **kwargs)
    assert_identical(ours, theirs)


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


@pytest.mark.parametrize("output_type", ["latent", "np"])
@pytest.mark.parametrize("case", list(IMAGE2IMAGE_CASES))
def test_image2image_parity(sd_pipe, case, output_type):
    """Image-to-image equals StableDiffusionImg2ImgPipeline, including the default strength (0.8)."""
    ours, theirs = run_both(
        sd_pipe, "image2image", image=make_image(), output_type=output_type, **IMAGE2IMAGE_CASES[case]
    )
    assert_identical(ours, theirs)


def test_image2image_generator_list(sd_pipe):
    """With one generator per image, each repeated reference image is encoded with its own generator."""
    kwargs = {"prompt": "a cat", "image": make_image(), "num_images_per_prompt": 2, "num_inference_steps": 3}
    theirs = classic_from(sd_pipe, "image2image")(
        generator=[torch.Generator("cpu").manual_seed(s) for s in (1, 2)], output_type="latent", **kwargs
    ).images
    ours = sd_pipe(
        generator=[torch.Generator("cpu").manual_seed(s) for s in (1, 2)],
        output_type="latent",
        output="images",
        **kwargs,
    )
    assert_identical(ours, theirs)


INPAINT_CASES = {
    "default_strength": {"prompt": "a photo of a cat"},
    "strength": {"prompt": "a photo of a cat", "strength": 0.75, "num_inference_steps": 4},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"]},
    "no_guidance": {"prompt": ["a cat", "a red dog"], "guidance_scale": 1.0},
}


@pytest.mark.parametrize("output_type", ["latent", "np"])
@pytest.mark.parametrize("case", list(INPAINT_CASES))
@pytest.mark.parametrize("unet_channels", [9, 4])
def test_inpainting_parity(sd_pipe, sd_inpaint_pipe, unet_channels, case, output_type):
    """Inpainting equals StableDiffusionInpaintPipeline for a 9-channel and a 4-channel (blended) UNet."""
    pipe = sd_inpaint_pipe if unet_channels == 9 else sd_pipe
    assert pipe.unet.config.in_channels == unet_channels
    kwargs = {"num_inference_steps": STEPS, **INPAINT_CASES[case]}
    ours, theirs = run_both(
        pipe, "inpainting", image=make_image(), mask_image=make_mask(), output_type=output_type, **kwargs
    )
    assert_identical(ours, theirs)


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
            ours, theirs = run_both(sd_pipe, workflow, **kwargs)
            assert_identical(ours, theirs)
    finally:
        sd_pipe.update_components(scheduler=original)


def test_pil_output(sd_pipe):
    """output_type='pil' (the default) gives PIL images with the classic pipeline's pixels."""
    ours, theirs = run_both(sd_pipe, "text2image", prompt="a cat", num_inference_steps=STEPS)
    assert [image.size for image in ours] == [(64, 64)]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ours, theirs))


def test_guidance_embedding_unet_parity(sd_pipe):
    """A UNet with time_cond_proj_dim (LCM-style) gets the guidance embedding and no CFG, as in the classic."""
    config = dict(sd_pipe.unet.config)
    config["time_cond_proj_dim"] = 32
    torch.manual_seed(0)
    unet = type(sd_pipe.unet).from_config(config).eval()
    original = sd_pipe.unet
    sd_pipe.update_components(unet=unet)
    try:
        ours, theirs = run_both(
            sd_pipe,
            "text2image",
            prompt="a cat",
            guidance_scale=5.0,
            num_images_per_prompt=2,
            num_inference_steps=STEPS,
            output_type="latent",
        )
        assert_identical(ours, theirs)
    finally:
        sd_pipe.update_components(unet=original)


@pytest.mark.parametrize("unet_channels", [9, 4])
def test_sizes_follow_the_vae_scale_not_8(sd_pipe, sd_inpaint_pipe, unet_channels):
    """With a VAE of scale 2, a 44x36 image keeps its size in image-to-image, and inpainting makes 44x36,
    as in the classic pipelines (an image processor fixed at 8 made 40x32)."""
    pipe = sd_inpaint_pipe if unet_channels == 9 else sd_pipe
    assert vae_scale_factor(pipe) == 2
    kwargs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "np"}
    if unet_channels == 4:
        ours, theirs = run_both(pipe, "image2image", image=make_image(size=44, height=36), **kwargs)
        assert ours.shape == (1, 36, 44, 3)
        assert_identical(ours, theirs)
    inpaint = {"image": make_image(size=50), "mask_image": make_mask(size=50), "height": 36, "width": 44}
    ours, theirs = run_both(pipe, "inpainting", **inpaint, **kwargs)
    assert ours.shape == (1, 36, 44, 3)
    assert_identical(ours, theirs)


def test_image_processor_takes_the_scale_of_a_3_level_vae(sd_vae4_pipe):
    """With a VAE of scale 4, image-to-image and inpainting keep 44x36 and equal the classic pipelines."""
    assert vae_scale_factor(sd_vae4_pipe) == 4
    kwargs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "np"}
    ours, theirs = run_both(sd_vae4_pipe, "image2image", image=make_image(size=44, height=36), **kwargs)
    assert ours.shape == (1, 36, 44, 3)
    assert_identical(ours, theirs)
    inpaint = {"image": make_image(size=50), "mask_image": make_mask(size=50), "height": 36, "width": 44}
    ours, theirs = run_both(sd_vae4_pipe, "inpainting", **inpaint, **kwargs)
    assert ours.shape == (1, 36, 44, 3)
    assert_identical(ours, theirs)
