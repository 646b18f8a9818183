"""diffusers' own modular Wan pipelines (the peer) on our components give our videos bit for bit, per workflow:
Wan 2.1 and 2.2 text-to-video, Wan 2.1 and 2.2 image-to-video (max |ours - peer| = 0.0)."""

import logging

import numpy as np
import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

from ..helpers import STEPS, seeded
from .conftest import VIDEO, make_image

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

# Image-to-video with one prompt: the peer's Wan 2.1 image-to-video repeats the image embeddings for none.
TWO = {"prompt": ["a cat", "a dog"]}
KINDS = {
    "wan2.1": ("WanModularPipeline", TWO),
    "wan2.2": ("Wan22ModularPipeline", TWO),
    "wan2.1-i2v": ("WanImage2VideoModularPipeline", {"prompt": "a cat", "image": make_image()}),
    "wan2.2-i2v": ("Wan22Image2VideoModularPipeline", {"prompt": "a cat", "image": make_image()}),
}


def _peer_on(pipe, repo):
    """The peer's pipeline for `repo`, holding our pipeline's very models, both guiders at the classic scale."""
    peer = PeerPipeline.from_pretrained(str(repo))
    models = [name for name in pipe.pretrained_component_names if name in peer.component_names]
    ours = {name: pipe.components[name] for name in models if pipe.components[name] is not None}
    guiders = {name: ClassifierFreeGuidance(guidance_scale=5.0) for name in ("guider", "guider_2")}
    peer.update_components(**ours, **{name: g for name, g in guiders.items() if name in peer.component_names})
    peer.set_progress_bar_config(disable=True)
    return peer


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_peer_on_our_components_makes_our_videos(request, kind):
    """The peer picks its pipeline class for the repo, and its latents and numpy frames equal ours."""
    name = kind.replace(".", "").replace("-", "_")
    repo, pipe = request.getfixturevalue(f"{name}_repo"), request.getfixturevalue(f"{name}_pipe")
    peer_class, extra = KINDS[kind]
    peer = _peer_on(pipe, repo)
    assert type(peer).__name__ == peer_class
    inputs = {"num_inference_steps": STEPS, **VIDEO, **extra}
    theirs = peer(generator=seeded(0), output=["latents", "videos"], **inputs)
    latents = pipe(generator=seeded(0), output="videos", output_type="latent", **inputs)
    videos = pipe(generator=seeded(0), output="videos", **inputs)
    assert (latents - theirs["latents"]).abs().max().item() == 0.0
    assert torch.equal(latents, theirs["latents"])
    assert np.array_equal(videos, np.asarray(theirs["videos"]))
