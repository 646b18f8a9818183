"""A real pipeline under auto offload: same outputs, the plan reaches the manager, nothing copied back."""

import pytest
import torch

from modular import ComponentsManager
from offload import SimulatedDevice, module_nbytes

from .tiny_sd import tiny_sd_pipeline


def _run(pipe, **extra):
    generator = torch.Generator().manual_seed(0)
    return pipe(
        prompt="a cat", num_inference_steps=2, generator=generator, output_type="np", output="images", **extra
    )


def test_offloaded_run_equals_the_plain_run_and_copies_nothing_back(repo):
    """With a budget that forces evictions, outputs are bit-equal and no byte goes device-to-host."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    expected = _run(pipe)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    assert _run(pipe).tobytes() == expected.tobytes()
    assert _run(pipe).tobytes() == expected.tobytes()
    log = cm.offload_log
    assert any(entry.evicted for entry in log)
    assert sum(entry.bytes_to_host for entry in log) == 0
    cm.disable_auto_cpu_offload()
    assert all(getattr(m, "_hf_hook", None) is None for m in (pipe.unet, pipe.vae, pipe.text_encoder))


def test_the_pipeline_gives_its_plan_to_the_manager(repo, monkeypatch):
    """Before running, the pipeline tells the manager its models in order of use (loop body once)."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    seen = []
    monkeypatch.setattr(cm, "set_execution_plan", lambda objs: seen.append(list(objs)))
    _run(pipe)
    used = [obj for obj in seen[0] if isinstance(obj, torch.nn.Module)]
    assert used == [pipe.text_encoder, pipe.unet, pipe.vae]


def test_denoiser_stays_resident_while_the_text_encoder_makes_room(repo):
    """When the UNet and the VAE cannot both fit, the UNet is kept through the loop (no reload per step)."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    _run(pipe)
    unet_id = cm.get_id(pipe.unet)
    loads = [entry for entry in cm.offload_log if entry.model_id == unet_id and entry.bytes_to_device]
    assert len(loads) == 1


def test_blocks_place_tensors_where_the_hooked_models_run(repo, monkeypatch):
    """Under offload, pipe._execution_device is the engine's device (not where the host copies sit).

    diffusers' VAE encode/decode trigger the hook without moving their inputs, so the blocks must
    create latents on the execution device themselves.
    """
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    engine = cm.offload_engine
    # Pretend the engine runs models elsewhere than the host copies (as on CUDA).
    monkeypatch.setattr(type(engine), "execution_device", property(lambda self: torch.device("meta")))
    assert pipe.vae._hf_hook.execution_device == torch.device("meta")
    assert pipe._execution_device == torch.device("meta")


def test_to_is_refused_while_auto_offload_places_the_models(repo):
    """pipe.to() under auto offload raises, naming the models and the fix; nothing moves."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    with pytest.raises(
        ValueError, match=r"auto offload places \[.*'unet'.*\] on its own.*disable_auto_cpu_offload"
    ):
        pipe.to(torch.float16)
    assert pipe.unet.dtype == torch.float32
    cm.disable_auto_cpu_offload()
    assert pipe.to(torch.float16).unet.dtype == torch.float16
