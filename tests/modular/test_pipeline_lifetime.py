"""Pipelines that are gone leave nothing in the manager; the ones alive keep working."""

import gc

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from modular import ComponentsManager

from .tiny_sd import tiny_sd_pipeline


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_tiny_repo(tmp_path_factory.mktemp("lifetime") / "tiny-sd")


def generate(pipe):
    generator = torch.Generator().manual_seed(0)
    return pipe(prompt="a cat", num_inference_steps=2, generator=generator, output_type="pt", output="images")


def test_fifty_dropped_pipelines_leave_what_one_live_pipeline_needs(repo):
    """50 pipelines made, loaded and dropped on one manager leave only the live pipeline's registrations."""
    cm = ComponentsManager()
    live = tiny_sd_pipeline(repo, cm)
    needed = set(cm.components)
    assert {cid.rsplit("_", 1)[0] for cid in needed} >= {"image_processor", "mask_processor", "unet"}
    for _ in range(50):
        pipe = tiny_sd_pipeline(repo, cm)
        assert pipe.unet is live.unet and pipe.image_processor is not live.image_processor
        del pipe
    gc.collect()
    assert set(cm.components) == needed
    assert generate(live).shape == (1, 3, 64, 64)


def test_two_live_pipelines_give_what_each_gives_alone(repo):
    """Two live pipelines on one manager, with dropped ones around them, give bit-equal outputs to one alone."""
    expected = generate(tiny_sd_pipeline(repo, ComponentsManager()))
    cm = ComponentsManager()
    first = tiny_sd_pipeline(repo, cm)
    for _ in range(3):
        tiny_sd_pipeline(repo, cm)
    second = tiny_sd_pipeline(repo, cm)
    gc.collect()
    assert sum(cid.startswith("image_processor_") for cid in cm.components) == 2
    assert torch.equal(generate(first), expected)
    assert torch.equal(generate(second), expected)


def test_from_config_object_given_to_another_pipeline_stays_while_either_lives(repo):
    """A from-config object one pipeline made and another took stays registered until both are gone."""
    cm = ComponentsManager()
    maker, taker = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    processor = maker.image_processor
    taker.update_components(image_processor=processor)
    component_id = cm.get_id(processor)
    del maker
    gc.collect()
    assert component_id in cm
    del taker
    gc.collect()
    assert component_id not in cm
    assert not any(cid.startswith(("image_processor_", "mask_processor_")) for cid in cm.components)


def test_dropped_pipeline_keeps_its_from_pretrained_components(repo):
    """Loaded models stay in the manager after their pipeline is gone, for the next pipeline to reuse."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    unet_id = cm.get_id(pipe.unet)
    del pipe
    gc.collect()
    assert unet_id in cm
    assert tiny_sd_pipeline(repo, cm).unet is cm.get_one(component_id=unet_id)
