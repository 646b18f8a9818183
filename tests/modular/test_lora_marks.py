"""A model whose weights differ from its source (a fused LoRA, an edit) is marked so, and is never handed out
as the source's weights."""

import pytest
import torch

from components.model_info import lora_layers
from components.weight_marks import FUSED_LORA, MODIFIED
from modular import ComponentsManager

from .tiny_sd import tiny_sd_images, tiny_sd_pipeline


@pytest.fixture(scope="module")
def original(repo):
    return tiny_sd_images(tiny_sd_pipeline(repo, ComponentsManager()))


def test_a_fused_then_unloaded_lora_marks_the_model_and_a_second_pipeline_loads_the_original(
    repo, lora, original
):
    """After fuse_lora and unload_lora_weights the model info and the table mark the fused models, and a
    second pipeline asking for the repo's weights gets fresh copies with the original outputs."""
    cm = ComponentsManager()
    first = tiny_sd_pipeline(repo, cm)
    first.load_lora_weights(lora, adapter_name="style")
    first.fuse_lora(lora_scale=0.5)
    first.unload_lora_weights()
    fused = tiny_sd_images(first)
    assert lora_layers(first.unet) == [] and not torch.equal(fused, original)
    unet_id = cm.get_id(first.unet)
    label = f"StableDiffusionAutoBlocks@{id(first):#x}"
    expected = f"LoRA ['style'] fused (lora_scale 0.5) by {label}"
    assert cm.get_model_info(unet_id, "modified") == {"modified": [expected]}
    assert cm.get_model_info(cm.get_id(first.vae), "modified") == {"modified": None}
    table = cm.table()
    assert f"{cm.get_model_info(unet_id, 'load_id')['load_id']} (modified)" in table
    assert f"{unet_id}:\n  Modified: {expected}" in table
    second = tiny_sd_pipeline(repo, cm)
    assert second.unet is not first.unet and second.text_encoder is not first.text_encoder
    assert second.vae is first.vae  # untouched models are still shared
    assert torch.equal(tiny_sd_images(second), original)
    assert torch.equal(tiny_sd_images(first), fused)


def test_unfusing_drops_the_mark_only_when_the_weights_are_the_sources_again(repo, lora, original):
    """After unfuse_lora the mark goes when the unfused weights equal the source files (a fuse at lora_scale 0
    adds and subtracts exact zeros), and the model is reused again; when they differ (floating-point rounding
    of a real fuse, here made sure by a nudged value) it stays marked, says why, and is not reused."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    unet_id = cm.get_id(pipe.unet)
    pipe.load_lora_weights(lora, adapter_name="style")
    pipe.fuse_lora(lora_scale=0.0)
    assert cm.get_model_info(unet_id, "modified")["modified"] is not None
    pipe.unfuse_lora()
    assert cm.get_model_info(unet_id, "modified") == {"modified": None}
    assert tiny_sd_pipeline(repo, cm).unet is pipe.unet

    pipe.fuse_lora()
    with torch.no_grad():  # so that the unfused weights surely differ from the file's
        lora_layers(pipe.unet)[0].base_layer.weight[0, 0] += 1.0
    pipe.unfuse_lora()
    (why,) = cm.get_model_info(unet_id, "modified")["modified"]
    assert (
        why == "LoRA fused, then unfused: the weights may not be the source's (they differ from the source's)"
    )
    assert tiny_sd_pipeline(repo, cm).unet is not pipe.unet
    pipe.unload_lora_weights()
    assert not torch.equal(tiny_sd_images(pipe), original)


def test_an_edit_told_to_the_manager_marks_the_model(repo):
    """A model edited in place and refreshed with refresh_host_copy is marked and not reused; refreshing with
    edited=False (an adapter's own layers) leaves it unmarked."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    vae_id = cm.get_id(pipe.vae)
    cm.refresh_host_copy(vae_id, edited=False)
    assert cm.get_model_info(vae_id, "modified") == {"modified": None}
    with torch.no_grad():
        next(pipe.vae.parameters()).mul_(2)
    cm.refresh_host_copy(vae_id)
    assert cm.get_model_info(vae_id, "modified") == {
        "modified": ["weights edited in place (refresh_host_copy)"]
    }
    assert tiny_sd_pipeline(repo, cm).vae is not pipe.vae


def test_a_fused_model_is_saved_even_where_its_source_would_be_kept(repo, lora, tmp_path):
    """save_pretrained(overwrite_modular_index=False) keeps unchanged components' sources, but writes a fused
    model's weights: the saved folder loads back to the fused outputs."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    pipe.load_lora_weights(lora, adapter_name="style")
    pipe.fuse_lora()
    fused = tiny_sd_images(pipe)
    pipe.save_pretrained(tmp_path / "saved", overwrite_modular_index=False)
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [
        "modular_model_index.json",
        "text_encoder",
        "unet",
    ]
    assert torch.equal(tiny_sd_images(tiny_sd_pipeline(tmp_path / "saved", ComponentsManager())), fused)
    assert getattr(pipe.unet, MODIFIED)[FUSED_LORA]
