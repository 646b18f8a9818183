"""save_pretrained of a pipeline holding a LoRA writes plain weights that load back: the base weights when the
LoRA is only loaded, the fused ones when it is fused."""

import torch
from safetensors.torch import load_file

from components.model_info import lora_layers
from modular import ComponentsManager

from .tiny_sd import tiny_sd_images, tiny_sd_pipeline


def _saved_keys(folder):
    return {key for path in folder.rglob("*.safetensors") for key in load_file(path)}


def test_a_pipeline_with_a_loaded_lora_saves_its_base_weights(repo, lora, tmp_path):
    """A LoRA only loaded is not in the save: the folder holds no peft names and loads back to the outputs of
    the pipeline without the LoRA; the pipeline keeps its LoRA."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    base = tiny_sd_images(pipe)
    pipe.load_lora_weights(lora, adapter_name="style")
    with_lora = tiny_sd_images(pipe)
    pipe.save_pretrained(tmp_path / "saved")
    keys = _saved_keys(tmp_path / "saved")
    assert not [key for key in keys if "base_layer" in key or "lora_" in key]
    again = tiny_sd_pipeline(tmp_path / "saved", ComponentsManager())
    assert torch.equal(tiny_sd_images(again), base)
    assert lora_layers(again.unet) == [] and lora_layers(again.text_encoder) == []
    assert pipe.get_list_adapters() == {"unet": ["style"], "text_encoder": ["style"]}
    assert torch.equal(tiny_sd_images(pipe), with_lora)
    assert any(".base_layer." in key for key in pipe.unet.state_dict())  # the model's own names are back


def test_a_pipeline_with_a_fused_lora_saves_the_fused_weights(repo, lora, tmp_path):
    """After fuse_lora the saved folder loads back to the fused pipeline's outputs, with or without the LoRA
    unloaded before the save."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    pipe.load_lora_weights(lora, adapter_name="style")
    pipe.fuse_lora()
    fused = tiny_sd_images(pipe)
    pipe.save_pretrained(tmp_path / "fused")
    pipe.unload_lora_weights()
    pipe.save_pretrained(tmp_path / "unloaded")
    for name in ("fused", "unloaded"):
        again = tiny_sd_pipeline(tmp_path / name, ComponentsManager())
        assert torch.equal(tiny_sd_images(again), fused), name
