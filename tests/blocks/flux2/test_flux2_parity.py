"""Our Flux.2 blocks equal diffusers' Flux2Pipeline bit for bit on CPU float32, with and without reference images."""

import torch

from .. import helpers
from ..helpers import STEPS, assert_identical, over_cases, seeded
from .conftest import SIZE, make_image, run_both

TEXT2IMAGE_CASES = {
    "prompt": {"prompt": "a photo of a cat"},
    "two_per_prompt": {"prompt": "a photo of a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 2.5},
    "size_and_length": {"prompt": "the astronaut", "height": 48, "width": 32, "max_sequence_length": 16},
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(flux2_pipe, case, output_type):
    """Text-to-image equals Flux2Pipeline for prompts, batches, n per prompt, guidance and sizes."""
    kwargs = {"height": SIZE, "width": SIZE, **TEXT2IMAGE_CASES[case]}
    kwargs.update(num_inference_steps=STEPS, output_type=output_type)
    assert_identical(*run_both(flux2_pipe, "text2image", **kwargs))


IMAGE_CASES = {
    "one_image": {"prompt": "a photo of a cat", "image": make_image()},
    "two_images": {"prompt": "a cat", "image": [make_image(), make_image(1, 64, 96)]},
    "two_per_prompt": {"prompt": ["a cat", "a red dog"], "image": make_image(), "num_images_per_prompt": 2},
    "size": {"prompt": "a cat", "image": make_image(2, 80, 72), "height": SIZE, "width": 48},
}


@over_cases(IMAGE_CASES)
def test_image_conditioned_parity(flux2_pipe, case, output_type):
    """Editing with one or several reference images equals Flux2Pipeline with the same images."""
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **IMAGE_CASES[case]}
    assert_identical(*run_both(flux2_pipe, "image_conditioned", **kwargs))


def test_reference_images_change_the_result(flux2_pipe):
    """A reference image, and a second one, each change the image made (the editing parity is not vacuous)."""
    kwargs = {"prompt": "a cat", "height": SIZE, "width": SIZE, "num_inference_steps": STEPS}
    kwargs.update(output_type="latent", output="images")
    plain = flux2_pipe(generator=seeded(0), **kwargs)
    one = flux2_pipe(generator=seeded(0), image=make_image(), **kwargs)
    two = flux2_pipe(generator=seeded(0), image=[make_image(), make_image(1)], **kwargs)
    assert not torch.equal(plain, one)
    assert not torch.equal(one, two)


def test_text2image_latents_sigmas_and_generator_list(flux2_pipe):
    """Given patchified latents, custom sigmas, and a list of generators (one per image) give the classic result."""
    base = {"prompt": "a cat", "num_images_per_prompt": 2, "height": SIZE, "width": SIZE}
    latents = torch.randn(2, 16, 8, 8, generator=seeded(5))
    assert_identical(
        *run_both(
            flux2_pipe,
            "text2image",
            seed=None,
            latents=latents,
            num_inference_steps=STEPS,
            output_type="np",
            **base,
        )
    )
    sigmas = {"sigmas": [1.0, 0.8, 0.3], "num_inference_steps": 3, "output_type": "latent"}
    assert_identical(*run_both(flux2_pipe, "text2image", **base, **sigmas))
    kwargs = {**base, "num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(*run_both(flux2_pipe, "text2image", seed=(1, 2), **kwargs))


def test_precomputed_embeddings_and_output_layers(flux2_pipe):
    """Precomputed prompt_embeds, and other text_encoder_out_layers, give the classic result."""
    embeds = torch.randn(2, 12, 48, generator=seeded(3))
    kwargs = {"height": SIZE, "width": SIZE, "num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(
        *run_both(flux2_pipe, "text2image", prompt_embeds=embeds, num_images_per_prompt=2, **kwargs)
    )
    layers = {"prompt": "a cat", "text_encoder_out_layers": (1, 5, 29), "max_sequence_length": 24}
    assert_identical(*run_both(flux2_pipe, "text2image", **layers, **kwargs))


def test_pil_output_and_image_latents_with_generator_list(flux2_pipe):
    """The default PIL output, and editing with one generator per image, equal the classic pipeline."""
    ours, theirs = run_both(
        flux2_pipe, "text2image", prompt="a cat", height=SIZE, width=SIZE, num_inference_steps=STEPS
    )
    helpers.assert_identical_pil(ours, theirs, size=(SIZE, SIZE))
    kwargs = {
        "prompt": "a cat",
        "image": make_image(),
        "num_images_per_prompt": 2,
        "num_inference_steps": STEPS,
    }
    assert_identical(*run_both(flux2_pipe, "image_conditioned", seed=(1, 2), output_type="latent", **kwargs))
