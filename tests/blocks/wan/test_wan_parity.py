"""Our Wan blocks equal diffusers' WanPipeline and WanImageToVideoPipeline bit for bit on CPU float32, for
one transformer (Wan 2.1) and two experts (Wan 2.2)."""

import numpy as np
import pytest
import torch

from blocks.wan import WanBlocks, WanImage2VideoAutoBlocks

from .. import helpers
from ..helpers import STEPS, assert_identical, seeded
from .conftest import VIDEO, WAN, make_image, run_both

TEXT2VIDEO_CASES = {
    **{name: dict(case) for name, case in helpers.PROMPT_CASES.items()},
    "no_guidance": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 1.0},
    "size_frames_and_length": {
        "prompt": "the astronaut",
        "height": 48,
        "width": 32,
        "num_frames": 9,
        "max_sequence_length": 8,
    },
    "frames_rounded": {"prompt": "a cat", "num_frames": 7},  # rounded down to 5, as the classic pipeline
}
for _case in TEXT2VIDEO_CASES.values():  # the shared cases say images; Wan makes videos
    if "num_images_per_prompt" in _case:
        _case["num_videos_per_prompt"] = _case.pop("num_images_per_prompt")

OUTPUT_TYPES = ["latent", "np"]


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
@pytest.mark.parametrize("case", list(TEXT2VIDEO_CASES))
@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_text2video_parity(request, kind, case, output_type):
    """Text-to-video equals WanPipeline for prompts, negatives, batches, n per prompt, no CFG, sizes and frames."""
    pipe = request.getfixturevalue(f"{kind.replace('.', '')}_pipe")
    kwargs = {**TEXT2VIDEO_CASES[case], "num_inference_steps": STEPS, "output_type": output_type}
    assert_identical(*run_both(pipe, "text2video", **kwargs))


@pytest.mark.parametrize("guidance_scale_2", [2.0, 7.0])
def test_two_experts_guidance_scale_2(wan22_pipe, guidance_scale_2):
    """guidance_scale_2 is the low-noise expert's scale, as the classic pipeline's."""
    kwargs = {"prompt": "a cat", "guidance_scale": 4.0, "guidance_scale_2": guidance_scale_2}
    ours, theirs = run_both(
        wan22_pipe, "text2video", num_inference_steps=STEPS, output_type="latent", **kwargs
    )
    assert_identical(ours, theirs)
    same = wan22_pipe(
        prompt="a cat",
        generator=seeded(0),
        num_inference_steps=STEPS,
        output_type="latent",
        output="videos",
        guidance_scale=4.0,
        **VIDEO,
    )
    assert not torch.equal(ours, same)  # the scale reaches the second expert


@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_text2video_precomputed_embeddings(request, kind):
    """Precomputed prompt_embeds and negative_prompt_embeds give the classic result; with two videos per prompt
    (where the classic pipeline fails: it repeats only the embeddings it encodes) they are repeated per video."""
    pipe = request.getfixturevalue(f"{kind.replace('.', '')}_pipe")
    tensors = helpers.random_tensors(3, prompt_embeds=(2, 12, 32), negative_prompt_embeds=(2, 12, 32))
    kwargs = {"num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(*run_both(pipe, "text2video", **tensors, **kwargs))
    repeated = {name: value.repeat_interleave(2, dim=0) for name, value in tensors.items()}
    ours, theirs = run_both(pipe, "text2video", **repeated, **kwargs)
    per_video = pipe(
        generator=seeded(0), output="videos", num_videos_per_prompt=2, **tensors, **kwargs, **VIDEO
    )
    assert_identical(ours, theirs)
    assert torch.equal(per_video, theirs)


def test_text2video_prompt_embeds_with_an_empty_negative(wan22_pipe):
    """Given prompt_embeds alone with guidance, the empty negative prompt is encoded, as the classic pipeline does."""
    tensors = helpers.random_tensors(4, prompt_embeds=(1, 512, 32))
    assert_identical(
        *run_both(wan22_pipe, "text2video", num_inference_steps=STEPS, output_type="latent", **tensors)
    )


def test_text2video_latents_and_generator_list(wan22_pipe):
    """Given latents (no generator), and one generator per video, each give the classic result."""
    latents = torch.randn(2, 16, 2, 4, 4, generator=seeded(5))
    kwargs = {
        "prompt": "a cat",
        "num_videos_per_prompt": 2,
        "num_inference_steps": STEPS,
        "output_type": "np",
    }
    assert_identical(*run_both(wan22_pipe, "text2video", seed=None, latents=latents, **kwargs))
    assert_identical(*run_both(wan22_pipe, "text2video", seed=(1, 2), **kwargs))


def test_more_steps_use_both_experts_in_turn(wan22_pipe):
    """Over 4 steps the boundary falls between steps: the result still equals the classic pipeline."""
    assert_identical(
        *run_both(wan22_pipe, "text2video", prompt="a cat", num_inference_steps=4, output_type="latent")
    )


IMAGE2VIDEO_CASES = {
    "guided": {"prompt": "a photo of a cat"},
    "negative_prompt": {"prompt": "a cat", "negative_prompt": "blurry"},
    "two_prompts": {"prompt": ["a photo of a cat", "a red dog"], "negative_prompt": ["blurry", "blue"]},
    "no_guidance": {"prompt": "a cat", "guidance_scale": 1.0},
    "size_and_frames": {"prompt": "a cat", "height": 48, "width": 32, "num_frames": 9},
}


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
@pytest.mark.parametrize("case", list(IMAGE2VIDEO_CASES))
@pytest.mark.parametrize("kind", ["wan2.1-i2v", "wan2.2-i2v"])
def test_image2video_parity(request, kind, case, output_type):
    """Image-to-video equals WanImageToVideoPipeline: CLIP-conditioned (Wan 2.1) and two experts (Wan 2.2)."""
    pipe = request.getfixturevalue(f"{kind.replace('.', '').replace('-', '_')}_pipe")
    kwargs = {"image": make_image(), **IMAGE2VIDEO_CASES[case]}
    assert_identical(
        *run_both(pipe, "image2video", num_inference_steps=STEPS, output_type=output_type, **kwargs)
    )


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
def test_first_and_last_frame_parity(wan22_i2v_pipe, output_type):
    """image and last_image (the first and last frames) equal the classic pipeline's. (Wan 2.1's FLF2V needs a
    transformer with pos_embed_seq_len for the two frames' CLIP embeddings, which the tiny 2.1 repo has not.)"""
    kwargs = {"prompt": "a cat", "image": make_image(), "last_image": make_image(seed=7)}
    assert_identical(
        *run_both(wan22_i2v_pipe, "image2video", num_inference_steps=STEPS, output_type=output_type, **kwargs)
    )


def test_image2video_videos_per_prompt_and_generator_list(wan22_i2v_pipe):
    """Two videos of one prompt, from one generator and from a list of two, equal the classic pipeline's."""
    kwargs = {
        "prompt": "a cat",
        "image": make_image(),
        "num_videos_per_prompt": 2,
        "num_inference_steps": STEPS,
    }
    assert_identical(*run_both(wan22_i2v_pipe, "image2video", output_type="latent", **kwargs))
    assert_identical(*run_both(wan22_i2v_pipe, "image2video", seed=(1, 2), output_type="np", **kwargs))


@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_pt_and_pil_outputs(request, kind):
    """output_type 'pt' is a [videos, frames, 3, H, W] tensor and 'pil' a list of PIL frames per video, as classic."""
    pipe = request.getfixturevalue(f"{kind.replace('.', '')}_pipe")
    ours, theirs = run_both(pipe, "text2video", prompt="a cat", num_inference_steps=STEPS, output_type="pt")
    assert_identical(ours, theirs, shape=(1, 5, 3, 32, 32))
    ours, theirs = run_both(
        pipe, "text2video", prompt=["a cat", "a dog"], num_inference_steps=STEPS, output_type="pil"
    )
    assert [len(video) for video in ours] == [5, 5]
    assert all(frame.size == (32, 32) for video in ours for frame in video)
    for video, classic in zip(ours, theirs, strict=True):
        helpers.assert_identical_pil(video, classic)


def test_np_output_is_the_default(wan22_pipe):
    """Without output_type the videos are numpy frames [videos, frames, H, W, 3] in [0, 1], as classic's default."""
    ours, theirs = run_both(wan22_pipe, "text2video", prompt="a cat", num_inference_steps=STEPS)
    assert isinstance(ours, np.ndarray)
    assert_identical(ours, theirs, shape=(1, 5, 32, 32, 3))
    assert 0.0 <= ours.min() and ours.max() <= 1.0


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
@pytest.mark.parametrize("workflow", ["text2video", "image2video"])
def test_expand_timesteps_parity(wan21_repo, workflow, output_type):
    """With the repo's expand_timesteps (Wan 2.2 TI2V: one timestep per latent patch; image-to-video on the
    text-to-video transformer, the first latent frame the image's), both workflows equal the classic pipelines.
    Image-to-video runs on a repo whose index does not list an image encoder: absent, and planned without."""
    blocks_class = WanImage2VideoAutoBlocks if workflow == "image2video" else WanBlocks
    pipe = blocks_class().init_pipeline(wan21_repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    pipe.update_components(expand_timesteps=True)
    extra = {"image": make_image()} if workflow == "image2video" else {}
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": output_type, **extra}
    ours, theirs = WAN.run_both(pipe, workflow, classic_config={"expand_timesteps": True}, **VIDEO, **kwargs)
    assert_identical(ours, theirs)
    if workflow == "text2video":  # the timesteps per patch take another path through the transformer
        plain = WAN.run_both(pipe, workflow, **VIDEO, **kwargs)[1]  # the classic pipeline without them
        assert not np.array_equal(np.asarray(ours), np.asarray(plain))
