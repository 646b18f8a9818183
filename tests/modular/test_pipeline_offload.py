"""A real pipeline under auto offload: same outputs, the plan reaches the manager, nothing copied back."""

import pytest
import torch
from diffusers import StableDiffusionPipeline

from modular import ComponentsManager
from offload import DeviceMoveError, SimulatedDevice, module_nbytes

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


def _classic(cm):
    classic = StableDiffusionPipeline(**cm.components_for(StableDiffusionPipeline))
    classic.set_progress_bar_config(disable=True)
    return classic


def _run_classic(classic):
    generator = torch.Generator().manual_seed(0)
    return classic(prompt="a cat", num_inference_steps=2, generator=generator, output_type="np").images


def _models(pipe):
    return [pipe.text_encoder, pipe.unet, pipe.vae]


def test_a_device_move_is_refused_alike_for_classic_and_modular_pipelines(repo):
    """Under auto offload, pipe.to("meta") of our pipeline and of a classic one on the manager's components
    both raise DeviceMoveError naming the models and the fix; nothing moves and outputs stay bit-equal."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    classic = _classic(cm)
    ours, theirs = _run(pipe), _run_classic(classic)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    refusal = r"auto offload places \[.*'{}.*\] on its own .* moving them to meta by hand would bypass it"
    with pytest.raises(DeviceMoveError, match=refusal.format("unet")):
        pipe.to("meta")
    with pytest.raises(DeviceMoveError, match=refusal.format("text_encoder_")):
        classic.to("meta")
    assert all(p.device.type == "cpu" for model in _models(pipe) for p in model.parameters())
    assert _run(pipe).tobytes() == ours.tobytes()
    assert _run_classic(classic).tobytes() == theirs.tobytes()


def test_to_where_the_models_are_is_allowed_alike(repo):
    """On a simulated device every weight is on the CPU: pipe.to("cpu") moves nothing and is allowed for both
    pipelines, with outputs bit-equal after."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    classic = _classic(cm)
    ours, theirs = _run(pipe), _run_classic(classic)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    assert pipe.to("cpu") is pipe
    classic.to("cpu")
    assert _run(pipe).tobytes() == ours.tobytes()
    assert _run_classic(classic).tobytes() == theirs.tobytes()


@pytest.mark.parametrize("which", ["modular", "classic"])
def test_a_dtype_conversion_goes_through_auto_offload_alike(repo, which):
    """pipe.to(torch.float64) under auto offload converts every model for both pipelines: the engine counts
    their new sizes, and outputs equal the same pipeline's after the same conversion without offload."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    target, run = (pipe, _run) if which == "modular" else (_classic(cm), _run_classic)
    budget = 2 * (module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder))  # in float64: evictions
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    target.to(torch.float64)
    engine = cm.offload_engine
    assert all(m.dtype == torch.float64 for m in _models(pipe))
    assert all(engine.nbytes(cm.get_id(m)) == module_nbytes(m) for m in _models(pipe))
    offloaded = run(target)
    assert any(entry.reason.startswith("evict") for entry in cm.offload_log)  # room made for the new sizes
    cm.disable_auto_cpu_offload()
    assert run(target).tobytes() == offloaded.tobytes()
