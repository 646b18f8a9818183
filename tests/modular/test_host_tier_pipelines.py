"""Pipelines under a host budget: saving, fusing and unloading meet models whose host copy is on disk, and read
them back (or leave them unread) rather than see their placeholders."""

import pytest
import torch
from diffusers import StableDiffusionPipeline
from safetensors.torch import load_file

from components.peer_pipelines import PlannedPeerPipeline
from modular import ComponentsManager
from offload import SimulatedDevice, module_nbytes
from tests.blocks.lora_helpers import CLIP_TARGETS, DENOISER_TARGETS, make_lora

from .saved import same_weights
from .tiny_sd import tiny_sd_images, tiny_sd_pipeline

MODELS = ("unet", "vae", "text_encoder")


@pytest.fixture(scope="module")
def lora(repo, tmp_path_factory):
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    targets = {"unet": (pipe.unet, DENOISER_TARGETS), "text_encoder": (pipe.text_encoder, CLIP_TARGETS)}
    return make_lora(tmp_path_factory.mktemp("lora") / "a", StableDiffusionPipeline, targets)


def under_a_host_budget(pipe, cm, tmp_path):
    """Auto offload with room for one model on the device and no host copy held beyond it: after a call,
    every model but the last one run has its host copy on disk."""
    largest = max(module_nbytes(getattr(pipe, name)) for name in MODELS)
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(largest),
        memory_reserve_margin=0,
        host_budget=1,
        spill_folder=tmp_path / "spill",
    )
    engine = cm.offload_engine
    engine.shrink_victims = False  # victims leave whole: no resident prefix keeps a host copy
    images = tiny_sd_images(pipe)
    assert (
        engine.residency(cm.get_id(pipe.unet)).on_disk
        and engine.residency(cm.get_id(pipe.text_encoder)).on_disk
    )
    return images


def finite(model) -> bool:
    return all(tensor.isfinite().all() for tensor in model.state_dict().values())


def test_save_pretrained_under_a_host_budget_writes_the_real_weights(repo, tmp_path):
    """Models whose host copy is on disk are read back for the save: the saved folder loads to the repo's
    weights (no NaN) and gives the same images; the budget holds again after."""
    plain = tiny_sd_pipeline(repo, ComponentsManager())
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    images = under_a_host_budget(pipe, cm, tmp_path)
    tier = cm.offload_engine.host_tier
    held = tier.held_bytes()
    pipe.save_pretrained(tmp_path / "saved")
    assert tier.held_bytes() <= held  # each model read back for its save is dropped again after
    saved = tiny_sd_pipeline(tmp_path / "saved", ComponentsManager())
    for name in MODELS:
        assert finite(getattr(saved, name)) and same_weights(getattr(saved, name), getattr(plain, name)), name
    assert torch.equal(tiny_sd_images(saved), images)


def test_a_classic_pipeline_on_the_managers_models_saves_the_real_weights(repo, tmp_path):
    """diffusers' own save (each component's save_pretrained, as the peer's modular pipeline saves) of models
    on disk writes their values: the state dict reads them back."""
    plain = tiny_sd_pipeline(repo, ComponentsManager())
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    under_a_host_budget(pipe, cm, tmp_path)
    classic = StableDiffusionPipeline(**cm.components_for(StableDiffusionPipeline))
    classic.save_pretrained(tmp_path / "classic")
    unet = load_file(tmp_path / "classic" / "unet" / "diffusion_pytorch_model.safetensors")
    assert unet.keys() == plain.unet.state_dict().keys()
    assert all(torch.equal(value, plain.unet.state_dict()[key]) for key, value in unet.items())
    encoder = load_file(tmp_path / "classic" / "text_encoder" / "model.safetensors")
    assert all(torch.equal(value, plain.text_encoder.state_dict()[key]) for key, value in encoder.items())


def test_the_peers_modular_pipeline_saves_the_real_weights(tmp_path):
    """diffusers' ModularPipeline on our manager, run under a host budget, saves real weights."""
    from diffusers.modular_pipelines import StableDiffusionXLAutoBlocks

    import blocks.stable_diffusion_xl

    sdxl = blocks.stable_diffusion_xl.make_tiny_repo(tmp_path / "sdxl")
    cm = ComponentsManager()
    peer = StableDiffusionXLAutoBlocks().init_pipeline(str(sdxl), components_manager=cm)
    peer.load_components(torch_dtype=torch.float32)
    originals = {key: value.clone() for key, value in peer.unet.state_dict().items()}
    sizes = [module_nbytes(obj) for obj in cm.components.values() if isinstance(obj, torch.nn.Module)]
    cm.enable_auto_cpu_offload(device=SimulatedDevice(max(sizes)), memory_reserve_margin=0, host_budget=1)
    cm.offload_engine.shrink_victims = False
    PlannedPeerPipeline(peer, cm)(
        prompt="a cat", num_inference_steps=2, height=64, width=64, output_type="pt", output="images"
    )
    assert cm.offload_engine.residency(cm.get_id(peer.unet)).on_disk
    peer.save_pretrained(str(tmp_path / "saved"))
    saved = load_file(tmp_path / "saved" / "unet" / "diffusion_pytorch_model.safetensors")
    assert saved.keys() == originals.keys() and all(torch.equal(saved[k], originals[k]) for k in saved)


@pytest.mark.parametrize("unfuse", [False, True], ids=["fuse", "fuse then unfuse"])
def test_fuse_and_unfuse_lora_on_models_on_disk_equal_the_plain_run(repo, lora, tmp_path, unfuse):
    """fuse_lora (and unfuse_lora) into models whose host copy is on disk reads them back first: no torch error
    about overlapping memory, and the images equal a pipeline without offload after the same calls."""
    plain = tiny_sd_pipeline(repo, ComponentsManager())
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    under_a_host_budget(pipe, cm, tmp_path)
    for each in (plain, pipe):  # into models on disk: their LoRA layers spill at the next drop
        each.load_lora_weights(lora, adapter_name="a")
    assert torch.equal(tiny_sd_images(pipe), tiny_sd_images(plain))
    assert cm.offload_engine.residency(cm.get_id(pipe.unet)).on_disk
    for each in (plain, pipe):
        each.fuse_lora(lora_scale=0.7)
    assert torch.equal(tiny_sd_images(pipe), tiny_sd_images(plain))
    if unfuse:
        assert cm.offload_engine.residency(cm.get_id(pipe.unet)).on_disk
        for each in (plain, pipe):
            each.unfuse_lora()
        assert torch.equal(tiny_sd_images(pipe), tiny_sd_images(plain))
    cm.disable_auto_cpu_offload()
    for name in ("unet", "text_encoder"):
        assert finite(getattr(pipe, name)) and same_weights(getattr(pipe, name), getattr(plain, name))


def test_unload_components_of_a_model_on_disk_reads_nothing(repo, tmp_path):
    """unload_components of a model whose host copy is on disk frees it without reading it back; the other
    models keep running."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    under_a_host_budget(pipe, cm, tmp_path)
    text_encoder, read = pipe.text_encoder, cm.offload_log.total_bytes_from_disk
    pipe.unload_components("text_encoder")
    assert cm.offload_log.total_bytes_from_disk == read and cm.get_id(text_encoder) is None
    assert all(param.device.type == "meta" for param in text_encoder.parameters())
    pipe.load_components("text_encoder", torch_dtype=torch.float32)
    assert torch.equal(tiny_sd_images(pipe), tiny_sd_images(tiny_sd_pipeline(repo, ComponentsManager())))


def test_unloading_a_model_another_pipeline_runs_leaves_it_running(repo, tmp_path):
    """B.unload_components of a UNet that A shares, while its host copy is on disk, reads it back for A: A's
    next call gives the images it gave before (removal reads nothing back only for a model nobody runs)."""
    cm = ComponentsManager()
    first, second = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    assert first.unet is second.unet
    before = under_a_host_budget(first, cm, tmp_path)
    unet = first.unet
    second.unload_components("unet")
    assert cm.get_id(unet) is None and second.unet is None
    assert all(param.device.type == "cpu" for param in unet.parameters()) and finite(unet)
    assert torch.equal(tiny_sd_images(first), before)
