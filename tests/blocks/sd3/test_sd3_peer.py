"""Our SD3 pipeline beside diffusers' own modular SD3 pipeline (the peer) on the same components and seed.

The peer has text-to-image and image-to-image (no inpainting). It guides only when given a negative prompt (it
encodes no empty one, where the classic pipelines and ours do), so without one it equals ours unguided, bit for
bit; with one both guide at 7.0 and differ by float rounding: the peer runs the conditional and unconditional
passes as separate batches, the classic pipeline and ours as one batch of two.
"""

import pytest
import torch
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

from ..helpers import STEPS, seeded
from .conftest import COMPONENTS, make_image

WORKFLOWS = {"text2image": {}, "image2image": {"image": make_image(), "strength": 0.9}}


@pytest.fixture(scope="module")
def peer(sd3_repo, sd3_pipe):
    """diffusers' own modular SD3 pipeline on the tiny repo, on our pipeline's components."""
    peer = PeerPipeline.from_pretrained(str(sd3_repo))
    assert type(peer).__name__ == "StableDiffusion3ModularPipeline"
    peer.update_components(**{name: getattr(sd3_pipe, name) for name in COMPONENTS})
    peer.set_progress_bar_config(disable=True)
    return peer


def _both(pipe, peer, workflow, ours_extra=None, **inputs):
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, **WORKFLOWS[workflow], **inputs}
    theirs = peer(generator=seeded(0), output="latents", **kwargs)
    ours = pipe(generator=seeded(0), output="latents", **kwargs, **(ours_extra or {}))
    return ours, theirs


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
def test_unguided_the_peer_equals_ours_bit_for_bit(sd3_pipe, peer, workflow):
    """Without a negative prompt the peer runs one pass per step: ours with guidance_scale=1 gives its latents."""
    ours, theirs = _both(sd3_pipe, peer, workflow, ours_extra={"guidance_scale": 1.0})
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
def test_guided_the_peer_differs_from_ours_by_rounding_only(sd3_pipe, peer, workflow):
    """With a negative prompt both guide at 7.0; the latents agree to 1e-4 (about 4e-6 on the tiny repo), and
    guidance changed them."""
    ours, theirs = _both(sd3_pipe, peer, workflow, negative_prompt="blurry")
    assert (ours - theirs).abs().max() < 1e-4
    unguided, _ = _both(
        sd3_pipe, peer, workflow, ours_extra={"guidance_scale": 1.0}, negative_prompt="blurry"
    )
    assert (ours - unguided).abs().max() > 1e-2
