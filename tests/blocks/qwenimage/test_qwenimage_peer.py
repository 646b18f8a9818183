"""Diffusers' own modular Qwen-Image pipelines (the peer) on our components give our images bit for bit.

The peer's default guider guides with an empty negative prompt when none is given, where the classic pipeline
(and ours) runs one unguided pass: without a negative prompt the two agree once the peer's guider is disabled.
"""

import logging

from diffusers.guiders import ClassifierFreeGuidance
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline
from diffusers.modular_pipelines.qwenimage import encoders as peer_encoders
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit

from ..helpers import STEPS, assert_identical, seeded
from .conftest import SIZE, make_image

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)

TEXT2IMAGE = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
EDIT = ("transformer", "vae", "text_encoder", "processor", "scheduler")


def peer_on(repo, pipe, names):
    """The peer's pipeline for `repo`, holding `pipe`'s very component objects."""
    peer = PeerPipeline.from_pretrained(str(repo))
    peer.update_components(**{name: getattr(pipe, name) for name in names})
    peer.set_progress_bar_config(disable=True)
    return peer


def both(pipe, peer, **inputs):
    kwargs = {"num_inference_steps": STEPS, "output_type": "np", "output": "images", **inputs}
    return pipe(generator=seeded(0), **kwargs), peer(generator=seeded(0), **kwargs)


def test_text2image_equals_the_peers(qwen_repo, qwen_pipe):
    """With a negative prompt (one or two images per prompt) the peer's images are ours; without one, once the
    peer's guider is disabled; with its default guider it guides with an empty prompt, and differs."""
    peer = peer_on(qwen_repo, qwen_pipe, TEXT2IMAGE)
    assert type(peer).__name__ == "QwenImageModularPipeline"
    size = {"height": SIZE, "width": SIZE}
    for extra in ({}, {"num_images_per_prompt": 2}):
        assert_identical(*both(qwen_pipe, peer, prompt="a cat", negative_prompt="blurry", **size, **extra))
    ours, theirs = both(qwen_pipe, peer, prompt="a cat", **size)
    assert not (ours == theirs).all()
    peer.update_components(guider=ClassifierFreeGuidance(guidance_scale=4.0, enabled=False))
    assert_identical(*both(qwen_pipe, peer, prompt="a cat", **size))


def test_edit_equals_the_peers(qwen_edit_repo, qwen_edit_pipe, small_edit_area, monkeypatch):
    """The peer's edit pipeline on our components gives our images (the peer's resize step sized the same way:
    at 64 x 64 pixels, as small_edit_area sizes ours and the classic pipeline's)."""
    monkeypatch.setattr(peer_encoders, "calculate_dimensions", pipeline_qwenimage_edit.calculate_dimensions)
    peer = peer_on(qwen_edit_repo, qwen_edit_pipe, EDIT)
    assert type(peer).__name__ == "QwenImageEditModularPipeline"
    for extra in ({}, {"height": SIZE, "width": SIZE}):
        kwargs = {"image": make_image(), "prompt": "make it red", "negative_prompt": "blurry", **extra}
        assert_identical(*both(qwen_edit_pipe, peer, **kwargs))
