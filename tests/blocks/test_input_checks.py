"""Every family refuses bad inputs before any model runs: one error that names the input, the rule and the fix."""

import contextlib

import attrs
import numpy as np
import PIL.Image
import pytest
import torch

import blocks.flux as flux
import blocks.flux2 as flux2
import blocks.qwenimage as qwenimage
import blocks.sd3 as sd3
import blocks.stable_diffusion as sd
import blocks.stable_diffusion_xl as sdxl
import blocks.wan as wan
import blocks.z_image as z_image
from modular import SequentialPipelineBlocks

FAMILIES = {
    "sd": (sd, sd.StableDiffusionAutoBlocks, {}),
    "sd_inpaint": (sd, sd.StableDiffusionAutoBlocks, {"inpainting": True}),
    "sdxl": (sdxl, sdxl.StableDiffusionXLAutoBlocks, {}),
    "sdxl_inpaint": (sdxl, sdxl.StableDiffusionXLAutoBlocks, {"inpainting": True}),
    "flux": (flux, flux.FluxAutoBlocks, {}),
    "flux_control": (flux, flux.FluxAutoBlocks, {"control": True}),
    "z_image": (z_image, z_image.ZImageAutoBlocks, {}),
    "flux2": (flux2, flux2.Flux2AutoBlocks, {}),
    "sd3": (sd3, sd3.StableDiffusion3AutoBlocks, {}),
    "qwenimage": (qwenimage, qwenimage.QwenImageAutoBlocks, {}),
    "wan": (wan, wan.Wan22Blocks, {}),
}
SHARED = ["sd", "sdxl", "flux", "z_image", "sd3"]  # the families the shared rules are run on
# The check steps' names, the image side in pixels, the text-to-image size rule (8 for SD and SDXL, as
# their classic pipelines; twice the tiny VAE's scale of 2 for Flux and Z-Image) and the latent channels
# of an image given as latents.
INFO = {
    "sd": {"t2i": "StableDiffusionCheckInputsStep", "i2i": "StableDiffusionImg2ImgCheckInputsStep"},
    "sdxl": {"t2i": "StableDiffusionXLCheckInputsStep", "i2i": "StableDiffusionXLImg2ImgCheckInputsStep"},
    "flux": {"t2i": "FluxCheckInputsStep", "i2i": "FluxImg2ImgCheckInputsStep"},
    "z_image": {"t2i": "ZImageCheckInputsStep", "i2i": "ZImageImg2ImgCheckInputsStep"},
    "sd3": {"t2i": "StableDiffusion3CheckInputsStep", "i2i": "StableDiffusion3Img2ImgCheckInputsStep"},
}
SIZE = {"sd": 64, "sdxl": 64, "flux": 32, "z_image": 32, "flux2": 32, "sd3": 32, "qwenimage": 32, "wan": 32}
for _family, _values in {
    "sd": (8, 4),
    "sdxl": (8, 4),
    "flux": (4, 4),
    "z_image": (4, 16),
    "sd3": (4, 16),
}.items():
    INFO[_family].update(m=_values[0], latent_channels=_values[1])


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    """Our pipeline on a tiny repo of each kind, built on first use."""
    built = {}

    def get(kind):
        if kind not in built:
            family, blocks_class, options = FAMILIES[kind]
            repo = family.make_tiny_repo(tmp_path_factory.mktemp("repos") / kind, **options)
            pipe = blocks_class().init_pipeline(repo)
            pipe.load_components(torch_dtype=torch.float32)
            pipe.set_progress_bar_config(disable=True)
            built[kind] = pipe
        return built[kind]

    return get


@contextlib.contextmanager
def model_calls(pipe):
    """Record the name of every model component whose forward (or any submodule's) runs inside the block."""
    calls, handles = [], []
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            for module in component.modules():
                handles.append(module.register_forward_pre_hook(lambda *_, name=name: calls.append(name)))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def make_image(size, mode="RGB", height=None):
    """A random PIL image in `mode`."""
    shape = (size if height is None else height, size, 3)
    pixels = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    return PIL.Image.fromarray(pixels).convert(mode)


def make_mask(size):
    """A black L-mode mask with a white square in the middle."""
    mask = np.zeros((size, size), dtype=np.uint8)
    mask[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 255
    return PIL.Image.fromarray(mask)


def assert_refused(pipe, kwargs, error, message):
    """The call raises `error` with exactly `message`, and no model's forward ran."""
    with model_calls(pipe) as calls, pytest.raises(error) as info:
        pipe(**kwargs)
    assert str(info.value) == message
    assert calls == []


def call_kwargs(family, workflow, **kwargs):
    """Small valid inputs for `workflow` ("t2i" or "i2i") of `family`, updated with `kwargs`."""
    size = SIZE[family]
    base = {"prompt": "a cat", "num_inference_steps": 4, "output_type": "latent"}
    base.update({"height": size, "width": size} if workflow == "t2i" else {"image": make_image(size)})
    return {**base, **kwargs}


STEPS = "num_inference_steps ({}) must be at least 1; pass a positive number of denoising steps"
POSITIVE = "{name} ({value}) must be positive; pass a multiple of {m} such as {m}, or leave {name} unset"
OUTPUT_TYPE = "output_type ('jpg') must be one of ['pil', 'np', 'pt', 'latent']; pass one of those"
SHARED_RULES = {
    "steps_zero": ("t2i", {"num_inference_steps": 0}, STEPS.format(0)),
    "steps_negative": ("t2i", {"num_inference_steps": -2}, STEPS.format(-2)),
    "no_images_per_prompt": (
        "t2i",
        {"num_images_per_prompt": 0},
        "num_images_per_prompt (0) must be at least 1; pass a positive number of images per prompt",
    ),
    "height_zero": ("t2i", {"height": 0}, POSITIVE.replace("{name}", "height").replace("{value}", "0")),
    "width_negative": ("t2i", {"width": -8}, POSITIVE.replace("{name}", "width").replace("{value}", "-8")),
    "output_type": ("t2i", {"output_type": "jpg"}, OUTPUT_TYPE),
    "empty_prompt_list": (
        "t2i",
        {"prompt": []},
        "prompt ([]) is an empty list; pass a string or a list of at least one string",
    ),
    "image_grayscale": (
        "i2i",
        {"image": "L"},
        "image has 1 channel (a PIL image in mode 'L'), the VAE encodes 3; pass an RGB image, "
        "e.g. image.convert('RGB')",
    ),
    "image_rgba": (
        "i2i",
        {"image": "RGBA"},
        "image has 4 channels (a PIL image in mode 'RGBA'), the VAE encodes 3; pass an RGB image, "
        "e.g. image.convert('RGB')",
    ),
    "image_tensor_channels": (
        "i2i",
        {"image": torch.rand(1, 2, 32, 32)},
        "image has 2 channels (a tensor of shape (1, 2, 32, 32)); pass 3 (RGB), or {latent_channels} for latents",
    ),
    "image_count": (
        "i2i",
        {"prompt": ["a cat", "a dog"], "image": 3},
        "image holds 3 images for a batch of 2 (prompts x num_images_per_prompt); pass a number of images "
        "that divides 2, e.g. 1",
    ),
    "image_empty_list": (
        "i2i",
        {"image": []},
        "image is an empty list; pass an image or a list of at least one",
    ),
    "strength": (
        "i2i",
        {"strength": -0.5},
        "strength (-0.5) must be in [0, 1]; pass 0 to keep the image, 1 to replace it, or a value between",
    ),
    "several_problems": (
        "t2i",
        {"num_inference_steps": 0, "height": 0, "output_type": "jpg"},
        "3 problems with the inputs:\n  - "
        + STEPS.format(0)
        + f"\n  - {OUTPUT_TYPE}\n  - "
        + POSITIVE.replace("{name}", "height").replace("{value}", "0"),
    ),
}


@pytest.mark.parametrize("rule", list(SHARED_RULES))
@pytest.mark.parametrize("family", SHARED)
def test_shared_rules_refuse_before_any_model_runs(pipes, family, rule):
    """Each bad input is refused by the family's check step, naming input, rule and fix, before any model runs."""
    workflow, kwargs, message = SHARED_RULES[rule]
    size = SIZE[family]
    image = kwargs.get("image")
    if isinstance(image, str):  # a PIL mode
        kwargs = {**kwargs, "image": make_image(size, image)}
    elif isinstance(image, int):  # a number of images
        kwargs = {**kwargs, "image": [make_image(size)] * image}
    expected = f"{INFO[family][workflow]}: {message.format(**INFO[family])}"
    assert_refused(pipes(family), call_kwargs(family, workflow, **kwargs), ValueError, expected)


LATENT_SHAPES = {
    "sd": "(1, 4, 32, 32)",
    "sdxl": "(1, 4, 32, 32)",
    "flux": "(1, 64, 16)",
    "z_image": "(1, 16, 16, 16)",
    "sd3": "(1, 16, 16, 16)",
}
FAMILY_RULES = {
    "negative_count": {
        family: (
            "t2i",
            {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry"], **extra},
            f"negative_prompt has 1 entry for 2 prompts; pass one per prompt{alternative}",
        )
        for family, extra, alternative in (
            ("sd", {}, ""),
            ("sdxl", {}, ", or one string for all"),
            ("flux", {"true_cfg_scale": 2.0}, ""),
            ("z_image", {}, ""),
            ("sd3", {}, ", or one string for all"),
        )
    },
    "latents_shape": {
        family: (
            "t2i",
            {"latents": torch.zeros(2, 3, 3)},
            f"latents (shape (2, 3, 3)) must have shape {shape} for a batch of 1 (prompts x num_images_per_prompt) "
            f"at {SIZE[family]}x{SIZE[family]} pixels; pass latents of that shape, or none",
        )
        for family, shape in LATENT_SHAPES.items()
    },
    "too_many_images": {
        family: (
            "t2i",
            {"num_images_per_prompt": 10**9},
            f"latents for a batch of 1000000000 (prompts x num_images_per_prompt) at {SIZE[family]}x{SIZE[family]} "
            f"pixels would take {size} ({dims} x 4 bytes), over the limit of 64.0 GiB; lower num_images_per_prompt, "
            "the number of prompts, or height and width",
        )
        for family, size, dims in (
            ("sd", "14.9 TiB", "1000000000 x 4 x 32 x 32"),
            ("sdxl", "14.9 TiB", "1000000000 x 4 x 32 x 32"),
            ("flux", "3.7 TiB", "1000000000 x 4 x 16 x 16"),
            ("z_image", "14.9 TiB", "1000000000 x 16 x 16 x 16"),
            ("sd3", "14.9 TiB", "1000000000 x 16 x 16 x 16"),
        )
    },
    "size_not_divisible": {
        "sd": (
            "t2i",
            {"height": 36},
            "height (36) must be divisible by 8; pass a multiple of 8 such as 32 or 40",
        ),
        "sdxl": (
            "t2i",
            {"height": 36},
            "height (36) must be divisible by 8; pass a multiple of 8 such as 32 or 40",
        ),
        "flux": (
            "t2i",
            {"height": 2},
            "height (2) must be at least 4; pass 4 or more, or leave height unset",
        ),
        "z_image": (
            "t2i",
            {"width": 30},
            "width (30) must be divisible by 4; pass a multiple of 4 such as 28 or 32",
        ),
        "sd3": (
            "t2i",
            {"width": 30},
            "width (30) must be divisible by 4; pass a multiple of 4 such as 28 or 32",
        ),
    },
}


@pytest.mark.parametrize("family", SHARED)
@pytest.mark.parametrize("rule", list(FAMILY_RULES))
def test_rules_with_family_values_refuse_before_any_model_runs(pipes, rule, family):
    """Negative prompt counts, latents' shape, memory and size rules use each family's own values."""
    workflow, kwargs, message = FAMILY_RULES[rule][family]
    expected = f"{INFO[family][workflow]}: {message}"
    assert_refused(pipes(family), call_kwargs(family, workflow, **kwargs), ValueError, expected)


def _inpaint(size=64, **kwargs):
    return {
        "prompt": "a cat",
        "image": make_image(size),
        "mask_image": make_mask(size),
        "num_inference_steps": 2,
        "output_type": "latent",
        **kwargs,
    }


INPAINT_RULES = {
    "mask_channels": (
        {"mask_image": torch.rand(1, 3, 64, 64)},
        "mask_image has 3 channels (a tensor of shape (1, 3, 64, 64)); pass a single-channel mask, [B, 1, H, W]",
    ),
    "mask_count": (
        {"prompt": ["a cat", "a dog"], "mask_image": [make_mask(64)] * 3},
        "mask_image holds 3 images for a batch of 2 (prompts x num_images_per_prompt); pass a number of images "
        "that divides 2, e.g. 1",
    ),
    "latents_shape": (
        {"latents": torch.zeros(1, 4, 8, 8)},
        "latents (shape (1, 4, 8, 8)) must have shape (1, 4, 32, 32) for a batch of 1 (prompts x "
        "num_images_per_prompt) at 64x64 pixels; pass latents of that shape, or none",
    ),
    "strength": (
        {"strength": 2.0},
        "strength (2.0) must be in [0, 1]; pass 0 to keep the image, 1 to replace it, or a value between",
    ),
}


@pytest.mark.parametrize("rule", list(INPAINT_RULES))
@pytest.mark.parametrize("kind", ["sd", "sd_inpaint", "sdxl", "sdxl_inpaint"])
def test_inpainting_rules_refuse_before_any_model_runs(pipes, kind, rule):
    """A mask with channels or a count that cannot fit, bad latents or strength are refused before any model."""
    kwargs, message = INPAINT_RULES[rule]
    name = (
        "StableDiffusionXLInpaintCheckInputsStep"
        if kind.startswith("sdxl")
        else "StableDiffusionInpaintCheckInputsStep"
    )
    assert_refused(pipes(kind), _inpaint(**kwargs), ValueError, f"{name}: {message}")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            "sd",
            "StableDiffusionInpaintCheckInputsStep: height (35) must be divisible by 2; pass a multiple of 2 such as 34 or 36",
        ),
        (
            "sdxl",
            "StableDiffusionXLInpaintCheckInputsStep: height (36) must be divisible by 8; pass a multiple of 8 such as 32 or 40",
        ),
    ],
)
def test_inpainting_size_rule_is_the_classic_one(pipes, kind, message):
    """SD inpainting sizes are multiples of the VAE's scale, SDXL's multiples of 8, as their classic pipelines."""
    height = 35 if kind == "sd" else 36
    assert_refused(pipes(kind), _inpaint(height=height), ValueError, message)


OTHER_RULES = {
    "sd_negative_type": (
        "sd",
        {"prompt": ["a cat"], "negative_prompt": "blurry", "height": 64, "width": 64},
        TypeError,
        "StableDiffusionCheckInputsStep: negative_prompt (a str) must have the type of prompt (a list); "
        "pass both as str or both as list",
    ),
    "sdxl_negative_prompt_2_count": (
        "sdxl",
        {"prompt": ["a cat", "a dog"], "negative_prompt_2": ["blurry"], "height": 64, "width": 64},
        ValueError,
        "StableDiffusionXLCheckInputsStep: negative_prompt_2 has 1 entry for 2 prompts; pass one per prompt, "
        "or one string for all",
    ),
    "sdxl_img2img_latents_batch": (
        "sdxl",
        {"image": make_image(64), "latents": torch.zeros(2, 4, 8, 8), "strength": 1.0},
        ValueError,
        "StableDiffusionXLImg2ImgCheckInputsStep: latents (shape (2, 4, 8, 8)) must have shape (1, 4, *, *) for a "
        "batch of 1 (prompts x num_images_per_prompt); pass latents of that shape, or none",
    ),
    "flux_prompt_2_count": (
        "flux",
        {"prompt": ["a cat", "a dog"], "prompt_2": "a red dog", "height": 32, "width": 32},
        ValueError,
        "FluxCheckInputsStep: prompt_2 has 1 entry for 2 prompts; pass one per prompt",
    ),
    "flux_negative_type": (
        "flux",
        {"prompt": ["a cat"], "negative_prompt": "blurry", "true_cfg_scale": 2.0, "height": 32, "width": 32},
        TypeError,
        "FluxCheckInputsStep: negative_prompt (a str) must have the type of prompt (a list); "
        "pass both as str or both as list",
    ),
    "flux_control_image_on_plain_transformer": (
        "flux",
        {"control_image": make_image(32), "height": 32, "width": 32},
        ValueError,
        "FluxControlCheckInputsStep: the transformer takes 16 input channels for 16 output channels, not a "
        "control transformer; load a control transformer (e.g. FLUX.1-Canny-dev)",
    ),
    "flux_control_transformer_without_control_image": (
        "flux_control",
        {"height": 32, "width": 32},
        ValueError,
        "FluxCheckInputsStep: the transformer takes 32 input channels for 16 output channels, a control "
        "transformer; pass control_image",
    ),
    "flux_control_image_count": (
        "flux_control",
        {"prompt": ["a cat", "a dog"], "control_image": [make_image(32)] * 3, "height": 32, "width": 32},
        ValueError,
        "FluxControlCheckInputsStep: control_image holds 3 images for 2 prompts; pass 1 control image or one "
        "per prompt",
    ),
    "flux_control_image_channels": (
        "flux_control",
        {"control_image": torch.rand(1, 1, 32, 32), "height": 32, "width": 32},
        ValueError,
        "FluxControlCheckInputsStep: control_image has 1 channel (a tensor of shape (1, 1, 32, 32)); pass 3 (RGB)",
    ),
    "z_image_size_other_than_the_image": (
        "z_image",
        {"image": make_image(32), "height": 48},
        ValueError,
        "ZImageImg2ImgCheckInputsStep: height (48) must be the image's height (32, a multiple of 4): the image "
        "is not resized; leave height and width unset to use the image's size, or resize the image",
    ),
    "flux2_latents_shape": (
        "flux2",
        {"latents": torch.zeros(1, 16, 4, 4), "height": 32, "width": 32},
        ValueError,
        "Flux2CheckInputsStep: latents (shape (1, 16, 4, 4)) must have shape (1, 16, 8, 8) for a batch of 1 "
        "(prompts x num_images_per_prompt) at 32x32 pixels; pass latents of that shape, or none",
    ),
    "flux2_reference_image_size": (
        "flux2",
        {"image": [make_image(64), make_image(32)], "num_inference_steps": 0},
        ValueError,
        "Flux2EditCheckInputsStep: 2 problems with the inputs:\n  - num_inference_steps (0) must be at least 1; "
        "pass a positive number of denoising steps\n  - image[1] (32x32) must be at least 64 pixels a side; "
        "pass a larger image",
    ),
    "qwenimage_latents_shape": (
        "qwenimage",
        {"latents": torch.zeros(1, 16, 4), "height": 32, "width": 32},
        ValueError,
        "QwenImageCheckInputsStep: latents (shape (1, 16, 4)) must have shape (1, 4, 16) for a batch of 1 "
        "(prompts x num_images_per_prompt) at 32x32 pixels; pass latents of that shape, or none",
    ),
    "qwenimage_mask_shape": (
        "qwenimage",
        {"prompt": None, "prompt_embeds": torch.zeros(2, 5, 16), "prompt_embeds_mask": torch.ones(2, 4)},
        ValueError,
        "QwenImageCheckInputsStep: prompt_embeds_mask (shape (2, 4)) must have prompt_embeds's batch and length "
        "(2, 5)",
    ),
    "wan_frames_and_width": (
        "wan",
        {"num_frames": 0, "height": 32, "width": 30},
        ValueError,
        "WanCheckInputsStep: 2 problems with the inputs:\n  - num_frames (0) must be at least 1; pass a positive "
        "number of frames\n  - width (30) must be divisible by 16; pass a multiple of 16 such as 16 or 32",
    ),
}


@pytest.mark.parametrize("case", list(OTHER_RULES))
def test_family_rules_refuse_before_any_model_runs(pipes, case):
    """Rules of one family (prompt_2, control transformer and image, Z-Image's image size) refuse up front."""
    kind, kwargs, error, message = OTHER_RULES[case]
    kwargs = {"prompt": "a cat", "num_inference_steps": 4, "output_type": "latent", **kwargs}
    assert_refused(pipes(kind), kwargs, error, message)


@pytest.mark.parametrize("kind", ["sd", "sdxl", "flux", "z_image", "flux2", "sd3", "qwenimage", "wan"])
def test_a_good_call_runs_every_model(pipes, kind):
    """The recorder sees the text encoder, the denoiser and the VAE of a good call (so zero means none ran)."""
    pipe = pipes(kind)
    frames = {"num_frames": 5} if kind == "wan" else {}
    kwargs = call_kwargs(kind, "t2i", num_inference_steps=1, output_type="np", **frames)
    with model_calls(pipe) as calls:
        pipe(**kwargs)
    denoiser = "unet" if kind in ("sd", "sdxl") else "transformer"
    assert {"text_encoder", denoiser, "vae"} <= set(calls)


def _check_steps(blocks):
    step = blocks.sub_blocks["check_inputs"]
    return list(step.sub_blocks.values()) if step.sub_blocks else [step]


ALL_BLOCKS = [
    sd.StableDiffusionAutoBlocks,
    sdxl.StableDiffusionXLAutoBlocks,
    sdxl.StableDiffusionXLRefinerBlocks,
    flux.FluxAutoBlocks,
    z_image.ZImageAutoBlocks,
    flux2.Flux2AutoBlocks,
    sd3.StableDiffusion3AutoBlocks,
    qwenimage.QwenImageAutoBlocks,
    qwenimage.QwenImageEditAutoBlocks,
    wan.WanBlocks,
    wan.Wan22Image2VideoBlocks,
]


def _declared(blocks):
    """The blocks' inputs by name; strength (and num_inference_steps, whose default SD3's workflows differ in)
    without its default. The check step is the first block to read them in every workflow, so with it the
    composed input records each workflow's default by branch, and without it the next reader's
    (test_strength_defaults.py checks every reader's default)."""
    by_workflow = ("strength", "num_inference_steps")
    return {
        p.name: attrs.evolve(p, default=None, defaults_by_block=None) if p.name in by_workflow else p
        for p in blocks.inputs
    }


@pytest.mark.parametrize("blocks_class", ALL_BLOCKS, ids=lambda cls: cls.__name__)
def test_check_step_runs_first_and_changes_no_declaration(blocks_class):
    """The check step runs first, declares no component and no output, and leaves the inputs as declared."""
    blocks = blocks_class()
    assert list(blocks.sub_blocks)[0] == "check_inputs"
    for step in _check_steps(blocks):
        assert step.expected_components == []
        assert step.intermediate_outputs == []
        assert all(not param.required for param in step.inputs)
    workflows = (
        [blocks.get_workflow(name) for name in blocks._workflow_map] if blocks._workflow_map else [blocks]
    )
    for with_check in [blocks, *workflows]:
        others = {name: block for name, block in with_check.sub_blocks.items() if "check_inputs" not in name}
        without = SequentialPipelineBlocks.from_blocks_dict(others)
        assert _declared(with_check) == _declared(without)
