"""What every family's tests share: our pipeline beside the classic one on the very same objects, the
bit-for-bit checks, small test inputs, and the checks each family's tests make the same way.

A family's conftest describes itself once as a `ParityHarness` (its blocks, its classic pipelines per
workflow, the components they share) and binds `classic_from` and `run_both` from it; its fixtures come from
`repo_fixture` and `pipe_fixture`.
"""

import contextlib
import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np
import PIL.Image
import pytest
import torch
from diffusers.hooks import HookRegistry
from safetensors.torch import load_file

from modular import ComponentNotLoadedError, InputTypeError, ModularPipeline, available_families

STEPS = 2  # denoising steps of the small calls

# ----- inputs -----


def seeded(seed: int | tuple[int, ...]) -> torch.Generator | list[torch.Generator]:
    """A fresh CPU generator of `seed`, or for a tuple of seeds a list of them (one per image)."""
    if isinstance(seed, tuple):
        return [torch.Generator("cpu").manual_seed(s) for s in seed]
    return torch.Generator("cpu").manual_seed(seed)


def random_tensors(seed, **shapes):
    """Tensors of the given shapes, drawn in order from one CPU generator of `seed`."""
    generator = seeded(seed)
    return {name: torch.randn(*shape, generator=generator) for name, shape in shapes.items()}


def make_image(seed=0, size=64, height=None):
    """A random RGB PIL image, `size` wide and `height` (default `size`) high, the same for the same seed."""
    shape = (size if height is None else height, size, 3)
    pixels = np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def make_mask(size=64, height=None):
    """A black L-mode mask with a white rectangle in the middle (white is repainted)."""
    height = size if height is None else height
    mask = np.zeros((height, size), dtype=np.uint8)
    mask[height // 4 : 3 * height // 4, size // 4 : 3 * size // 4] = 255
    return PIL.Image.fromarray(mask)  # 2-D uint8: mode "L"


# ----- our pipeline and the classic one -----


@attrs.frozen
class ParityHarness:
    """How one family's tests build our pipeline and the classic diffusers pipelines on its objects."""

    blocks_class: type
    make_tiny_repo: Callable[..., Any]
    classic: Mapping[str, type]  # workflow -> classic pipeline class
    components: tuple[str, ...]  # what the classic pipelines take from ours
    classic_options: Mapping[str, Any] = attrs.field(factory=dict)  # fixed classic keywords
    output: str = "images"  # our output's name; the classic output's attribute is `classic_output`
    classic_output: str = "images"

    def load_pipeline(self, repo, blocks_class=None):
        """Our pipeline on `repo`, every component loaded in float32, progress bars off."""
        pipe = (blocks_class or self.blocks_class)().init_pipeline(repo)
        pipe.load_components(torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def classic_from(self, pipe, workflow, **config):
        """The classic diffusers pipeline for `workflow`, built on the very component objects of `pipe`."""
        components = {name: pipe.components.get(name) for name in self.components}
        classic = self.classic[workflow](**components, **self.classic_options, **config)
        classic.set_progress_bar_config(disable=True)
        return classic

    def run_both(self, pipe, workflow, seed=0, classic_config=None, classic_on=None, **kwargs):
        """Run ours and the classic pipeline with the same inputs and a fresh generator of the same seed each.

        `seed` may be a tuple (one generator per image), or None for no generator. The classic pipeline
        is built on the objects of `classic_on` (default: `pipe`) with `classic_config`. Each gets its own
        copy of the inputs: a classic pipeline may rewrite a list prompt in place.
        """
        classic = self.classic_from(
            pipe if classic_on is None else classic_on, workflow, **(classic_config or {})
        )
        generator = {} if seed is None else {"generator": seeded(seed)}
        theirs = getattr(classic(**generator, **copy.deepcopy(kwargs)), self.classic_output)
        generator = {} if seed is None else {"generator": seeded(seed)}
        ours = pipe(**generator, output=self.output, **copy.deepcopy(kwargs))
        return ours, theirs

    def repo_fixture(self, folder, doc, **options):
        """A session fixture: the tiny repo `make_tiny_repo` writes with `options` in a fresh `folder`."""

        def repo(tmp_path_factory):
            return self.make_tiny_repo(tmp_path_factory.mktemp("repos") / folder, **options)

        repo.__doc__ = doc
        return pytest.fixture(scope="session")(repo)

    def pipe_fixture(self, repo_fixture, blocks_class=None):
        """A session fixture: our pipeline (see `load_pipeline`) on the repo of the fixture named `repo_fixture`."""

        def pipe(request):
            return self.load_pipeline(request.getfixturevalue(repo_fixture), blocks_class)

        pipe.__doc__ = f"Our pipeline on {repo_fixture}, loaded in float32."
        return pytest.fixture(scope="session")(pipe)


def assert_identical(ours, theirs, shape=None):
    """torch.equal on tensors and on numpy arrays (as tensors); with `shape`, ours has that shape first."""
    if shape is not None:
        assert ours.shape == shape
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray)
        ours, theirs = torch.from_numpy(ours), torch.from_numpy(theirs)
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


def assert_identical_pil(ours, theirs, size=None):
    """The PIL images have the same pixels, one for one; with `size`, ours are one image of that size."""
    if size is not None:
        assert [image.size for image in ours] == [size]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ours, theirs, strict=True))


# The prompt cases of every family's text-to-image parity whose classic pipeline takes negative prompts.
PROMPT_CASES = {
    "guided": {"prompt": "a photo of a cat"},
    "negative_prompt": {"prompt": "a photo of a cat", "negative_prompt": "blurry"},
    "two_per_prompt": {"prompt": "a photo of a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a photo of a cat", "a red dog"], "negative_prompt": ["blurry", "blue"]},
}

#: The text-to-image cases the UNet families (Stable Diffusion, SDXL) share besides the prompt cases.
UNET_TEXT2IMAGE_CASES = {
    "no_guidance": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 1.0},
    "guidance_rescale": {"prompt": "a cat", "guidance_rescale": 0.7, "num_images_per_prompt": 2},
    "size": {"prompt": "a cat", "height": 48, "width": 32},
}


def over_cases(cases):
    """Parametrize a parity test over each named case of `cases` and both output types ('latent', 'np')."""

    def parametrize(test):
        test = pytest.mark.parametrize("case", list(cases))(test)
        return pytest.mark.parametrize("output_type", ["latent", "np"])(test)

    return parametrize


def assert_makes_44x36_as_the_classic(run_both, pipe, workflow, steps=3, **inputs):
    """`workflow` on `inputs` makes a 44x36 image equal to the classic pipeline's."""
    kwargs = {"prompt": "a cat", "num_inference_steps": steps, "output_type": "np", **inputs}
    assert_identical(*run_both(pipe, workflow, **kwargs), shape=(1, 36, 44, 3))


def assert_latents_and_generator_list(run_both, pipe, latents_shape):
    """Two images from given latents (no generator), then from one generator per image, equal the classic."""
    latents = torch.randn(*latents_shape, generator=seeded(5))
    kwargs = {
        "prompt": "a cat",
        "num_images_per_prompt": 2,
        "num_inference_steps": STEPS,
        "output_type": "np",
    }
    assert_identical(*run_both(pipe, "text2image", seed=None, latents=latents, **kwargs))
    assert_identical(*run_both(pipe, "text2image", seed=(1, 2), **kwargs))


def hooked_modules(module: torch.nn.Module) -> list[str]:
    """Names of the submodules that carry a diffusers hook (a guider's, left installed or not)."""
    return [
        name
        for name, sub in module.named_modules()
        if isinstance(getattr(sub, "_diffusers_hook", None), HookRegistry) and sub._diffusers_hook.hooks
    ]


# ----- what every family's tests check the same way -----


def workflow_steps(check, encoders=(), prepare=("set_timesteps", "prepare_latents"), denoise="denoise"):
    """The sub-blocks of a workflow in order: its check, the text encoder and inputs, its image encoders,
    the preparation steps, its denoising loop, and the decoder."""
    return [check, "text_encoder", "input", *encoders, *prepare, denoise, "decode"]


def assert_workflows(blocks, expected, chosen):
    """`blocks` offers the workflows of `expected` in order, each runs exactly its sub-blocks, and each
    workflow's inputs in `chosen` select its blocks."""
    assert blocks.available_workflows == list(expected)
    for workflow, names in expected.items():
        assert list(blocks.get_workflow(workflow).sub_blocks) == names
    for workflow, inputs in chosen.items():
        assert list(blocks.get_execution_blocks(**inputs).sub_blocks) == expected[workflow]


def assert_family(family, name, blocks_class, make_tiny_repo):
    """`family` is registered under `name` with these blocks and tiny-repo builder."""
    assert available_families()[name] is family
    assert family.blocks_class is blocks_class
    assert family.make_tiny_repo is make_tiny_repo


def assert_from_pretrained_loads_nothing(repos, blocks_class, components, model):
    """from_pretrained on each repo picks `blocks_class`, leaves `components` unloaded, and names the repo
    in `model`'s load ID."""
    for repo in repos:
        pipe = ModularPipeline.from_pretrained(repo)
        assert isinstance(pipe.blocks, blocks_class)
        assert set(pipe.null_component_names) == set(components)
        assert pipe.get_component_spec(model).load_id == f"{repo}|{model}|null|null"


def assert_doc_names(doc, components, *lines):
    """The doc has an entry for each component and contains each of `lines`."""
    for name in components:
        assert f"    {name} (" in doc
    for line in lines:
        assert line in doc


def common_bad_calls(step_prefix, image, no_steps_strength):
    """The bad calls every family refuses alike, each as (inputs, error, message); the messages name the
    family's check steps, `<step_prefix>CheckInputsStep` and `<step_prefix>Img2ImgCheckInputsStep`."""
    check, img2img_check = f"{step_prefix}CheckInputsStep", f"{step_prefix}Img2ImgCheckInputsStep"
    return {
        "output_type": (
            {"prompt": "a cat", "output_type": "jpeg"},
            ValueError,
            f"{check}: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']; pass one of those",
        ),
        "strength": (
            {"prompt": "a cat", "image": image, "strength": 1.5},
            ValueError,
            f"{img2img_check}: strength (1.5) must be in [0, 1]; pass 0 to keep the image, 1 to replace it, "
            "or a value between",
        ),
        "no_steps_left": (
            {"prompt": "a cat", "image": image, "strength": no_steps_strength},
            ValueError,
            f"{img2img_check}: strength ({no_steps_strength}) with num_inference_steps (2) leaves 0 denoising "
            "steps; raise strength or num_inference_steps",
        ),
        "generators": (
            {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
            ValueError,
            "a list of generators needs one per image (got 3 for a batch of 1",
        ),
        "image_type": ({"prompt": "a cat", "image": "cat.png"}, InputTypeError, "input 'image' must be"),
    }


def reference(pipe, **inputs):
    """A fixed small call, to check that a failed call left the pipeline working as before."""
    kwargs = {"num_inference_steps": STEPS, "output_type": "np", "output": "images", **inputs}
    return pipe(prompt="a cat", generator=seeded(0), **kwargs)


def assert_refused_and_unchanged(pipe, call, error, message, **reference_inputs):
    """`pipe(**call)` raises `error` with `message` in it, and the reference call then gives what it gave before."""
    before = reference(pipe, **reference_inputs)
    with pytest.raises(error) as info:
        pipe(**call)
    assert message in str(info.value)
    assert np.array_equal(reference(pipe, **reference_inputs), before)


def assert_pt_is_np_transposed(pipe, size, **inputs):
    """output_type 'pt' gives a [1, 3, size, size] tensor in [0, 1] equal to the 'np' array transposed."""
    as_pt = reference(pipe, output_type="pt", **inputs)
    as_np = reference(pipe, output_type="np", **inputs)
    assert as_pt.shape == (1, 3, size, size)
    assert 0 <= as_pt.min() and as_pt.max() <= 1
    assert torch.equal(as_pt.permute(0, 2, 3, 1), torch.from_numpy(as_np))


def unloaded_component_error(blocks_class, repo) -> str:
    """The message of the error a call before load_components raises; it names text_encoder as missing."""
    pipe = blocks_class().init_pipeline(repo)
    with pytest.raises(ComponentNotLoadedError) as info:
        pipe(prompt="a cat")
    assert "needs component 'text_encoder', which is not loaded" in str(info.value)
    return str(info.value)


# ----- tiny repos -----


def assert_seed_decides_weights(make_tiny_repo, tmp_path, weights, **first_options):
    """Two repos built with the same seed hold identical `weights`; another seed changes them."""
    first = load_file(make_tiny_repo(tmp_path / "a", **first_options) / weights)
    second = load_file(make_tiny_repo(tmp_path / "b") / weights)
    other = load_file(make_tiny_repo(tmp_path / "c", seed=1) / weights)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def assert_variant_files(repo, variant, dtype, folders: Iterable[tuple[str, str]]):
    """Each (folder, weights) holds float32 weights and a `variant` file of the same tensors in `dtype`."""
    for name, weights in folders:
        plain = load_file(repo / name / f"{weights}.safetensors")
        half = load_file(repo / name / f"{weights}.{variant}.safetensors")
        assert {t.dtype for t in plain.values()} == {torch.float32}
        assert {t.dtype for t in half.values()} == {dtype}
        assert plain.keys() == half.keys()


# ----- previews (blocks/common/latent_preview.py) -----


def run_with_previews(pipe, every=None, decoder=None, seed=0, **kwargs):
    """Our pipeline's images for `kwargs` (a fresh generator of `seed`) and the previews it handed to
    on_preview every `every` steps (`every=None`: a call without previews, none)."""
    previews: list[Any] = []
    watch: dict[str, Any] = {} if every is None else {"preview_every": every, "on_preview": previews.append}
    if decoder is not None:
        watch["preview_decoder"] = decoder
    images = pipe(generator=seeded(seed), output="images", **watch, **copy.deepcopy(kwargs))
    return images, previews


def assert_previews_change_nothing(pipe, steps=3, batch=1, size=None, decoder=None, **kwargs):
    """The images are equal with and without previews (every step, every 2 steps), the previews come at the
    steps due, and each holds one RGB PIL image per image of the batch (of `size`, W x H, when given); with
    `decoder`, the previews are the preview decoder's.

    Returns the previews of every step."""
    kwargs = {"num_inference_steps": steps, "output_type": "np", **kwargs}
    expected, _ = run_with_previews(pipe, **kwargs)
    every_step: list[Any] = []
    for every in (1, 2):
        images, previews = run_with_previews(pipe, every, decoder, **kwargs)
        assert_identical(images, expected)
        assert previews, f"no preview every {every} steps: give the call more steps"
        total = previews[0].total
        assert [preview.step for preview in previews] == list(range(every, total + 1, every))
        assert all(preview.total == total for preview in previews)
        for preview in previews:
            assert len(preview.images) == batch
            assert all(isinstance(image, PIL.Image.Image) and image.mode == "RGB" for image in preview.images)
            assert size is None or all(image.size == size for image in preview.images)
        every_step = every_step or previews
    return every_step


def tiny_preview_decoder(latent_channels=4, seed=0):
    """A tiny random AutoencoderTiny (TAESD's layout at 8 channels, 2 levels: images at twice the latents' size),
    made without touching the global random state."""
    from diffusers import AutoencoderTiny

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoencoderTiny(
            encoder_block_out_channels=(8, 8),
            decoder_block_out_channels=(8, 8),
            num_encoder_blocks=(1, 1),
            num_decoder_blocks=(1, 1),
            latent_channels=latent_channels,
        ).eval()


@contextlib.contextmanager
def forwards_of(*models):
    """Inside, a list that gets the class name of each forward of `models` (for "before any model runs")."""
    calls: list[str] = []
    handles = [
        model.register_forward_pre_hook(lambda module, args: calls.append(type(module).__name__))
        for model in models
    ]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def assert_previews_show_the_latents(pipe, images_of, every=1, **kwargs):
    """Each preview (every `every` steps) is `images_of(latents)` of the latents as its step left them (read by a
    step callback, which runs before the preview)."""
    latents: list[torch.Tensor] = []

    def keep_latents(pipeline, step_index, timestep, callback_kwargs):
        latents.append(callback_kwargs["latents"].clone())
        return {}

    kwargs = {"prompt": "a cat", "num_inference_steps": 2, **kwargs}
    _, previews = run_with_previews(pipe, every, callback_on_step_end=keep_latents, **kwargs)
    due = latents[every - 1 :: every]
    assert len(previews) == len(due) > 0
    for preview, step_latents in zip(previews, due, strict=True):
        with torch.inference_mode():
            expected = images_of(step_latents)
        assert [np.asarray(image).tolist() for image in preview.images] == [
            np.asarray(image).tolist() for image in expected
        ]
