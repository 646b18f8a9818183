"""diffusers' own modular Flux.2 (the peer) on our components: equal to ours bit for bit in both workflows
once its text encoder step has the classic system message (its own lacks the classic message's line break)."""

import pytest
import torch
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline
from diffusers.modular_pipelines.flux2.encoders import Flux2TextEncoderStep as PeerTextEncoderStep
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

from blocks.flux2.utils import unpack_latents_with_ids

from ..helpers import STEPS, seeded
from .conftest import COMPONENTS, SIZE, make_image

WORKFLOWS = {
    "text2image": {"prompt": "a cat", "height": SIZE, "width": SIZE},
    "image_conditioned": {
        "prompt": ["a cat", "a red dog"],
        "image": [make_image(), make_image(1, 64, 96)],
        "num_images_per_prompt": 2,
    },
}


@pytest.fixture(scope="module")
def peer(flux2_repo, flux2_pipe):
    """The peer's Flux2ModularPipeline of the tiny repo, on our pipeline's component objects."""
    pipe = PeerPipeline.from_pretrained(str(flux2_repo))
    pipe.update_components(**{name: flux2_pipe.components[name] for name in COMPONENTS})
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def classic_system_message(monkeypatch):
    """The peer's text encoder step with the classic pipeline's system message, for one test."""
    monkeypatch.setattr(PeerTextEncoderStep, "DEFAULT_SYSTEM_MESSAGE", SYSTEM_MESSAGE)


def ours_unpacked(pipe, **inputs):
    out = pipe(generator=seeded(0), output_type="latent", output=["images", "latent_ids"], **inputs)
    return unpack_latents_with_ids(out["images"], out["latent_ids"])


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
def test_the_peer_equals_ours_with_the_classic_system_message(
    flux2_pipe, peer, classic_system_message, workflow
):
    """The peer's denoised latents equal ours, unpacked, bit for bit; so do the decoded images."""
    inputs = {"num_inference_steps": STEPS, **WORKFLOWS[workflow]}
    assert type(peer).__name__ == "Flux2ModularPipeline"
    assert torch.equal(
        ours_unpacked(flux2_pipe, **inputs), peer(generator=seeded(0), output="latents", **inputs)
    )
    theirs = peer(generator=seeded(0), output_type="pt", output="images", **inputs)
    assert torch.equal(flux2_pipe(generator=seeded(0), output_type="pt", output="images", **inputs), theirs)


def test_the_peers_own_system_message_changes_the_result(flux2_pipe, peer):
    """With its own system message (one line) the peer's latents differ from ours and the classic pipeline's."""
    inputs = {"num_inference_steps": STEPS, **WORKFLOWS["text2image"]}
    assert PeerTextEncoderStep.DEFAULT_SYSTEM_MESSAGE == " ".join(SYSTEM_MESSAGE.split()) != SYSTEM_MESSAGE
    assert not torch.equal(
        ours_unpacked(flux2_pipe, **inputs), peer(generator=seeded(0), output="latents", **inputs)
    )


@pytest.mark.parametrize("repo_fixture", ["klein_repo", "klein_distilled_repo"])
def test_the_peers_klein_equals_ours(request, repo_fixture):
    """The peer's Klein pipeline (base, with its guider; or distilled) on our components equals ours bit for bit
    in both workflows."""
    repo = request.getfixturevalue(repo_fixture)
    ours = request.getfixturevalue(repo_fixture.replace("repo", "pipe"))
    peer = PeerPipeline.from_pretrained(str(repo))
    expected = (
        "Flux2KleinModularPipeline"
        if repo_fixture == "klein_distilled_repo"
        else "Flux2KleinBaseModularPipeline"
    )
    assert type(peer).__name__ == expected
    peer.update_components(**{name: ours.components[name] for name in COMPONENTS})
    peer.set_progress_bar_config(disable=True)
    for inputs in WORKFLOWS.values():
        inputs = {"num_inference_steps": STEPS, **inputs}
        theirs = peer(generator=seeded(0), output_type="pt", output="images", **inputs)
        assert torch.equal(ours(generator=seeded(0), output_type="pt", output="images", **inputs), theirs)
