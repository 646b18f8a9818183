"""Flux.2 under the components manager's auto offload: the plan in order of use, and unchanged outputs."""

import torch

from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes

from .conftest import SIZE, make_image


def _pipeline(repo, cm):
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run(pipe, **extra):
    return pipe(
        prompt="a cat",
        num_inference_steps=3,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        output="images",
        height=SIZE,
        width=SIZE,
        **extra,
    )


def test_the_plan_lists_models_in_order_of_use(flux2_repo, monkeypatch):
    """Text-to-image uses text encoder, transformer, VAE; editing encodes the reference images with the VAE first."""
    cm = ComponentsManager()
    pipe = _pipeline(flux2_repo, cm)
    seen = []
    monkeypatch.setattr(cm, "set_execution_plan", lambda objs: seen.append(list(objs)))
    _run(pipe)
    _run(pipe, image=make_image())
    assert seen[0] == [pipe.text_encoder, pipe.transformer, pipe.vae]
    assert seen[1] == [pipe.text_encoder, pipe.vae, pipe.transformer, pipe.vae]


def test_offloaded_runs_equal_plain_runs(flux2_repo):
    """With a device budget that forces evictions, both workflows give bit-equal outputs."""
    cm = ComponentsManager()
    pipe = _pipeline(flux2_repo, cm)
    images = [make_image(), make_image(1)]
    expected = [_run(pipe), _run(pipe, image=images)]
    # Room for the largest model and a little: every switch to another model evicts.
    budget = max(module_nbytes(m) for m in (pipe.transformer, pipe.vae, pipe.text_encoder)) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    try:
        assert _run(pipe).tobytes() == expected[0].tobytes()
        assert _run(pipe, image=images).tobytes() == expected[1].tobytes()
        assert any(entry.evicted for entry in cm.offload_log)
    finally:
        cm.disable_auto_cpu_offload()


def test_under_a_host_budget_the_first_call_reads_the_vaes_batch_norm_stats(flux2_repo):
    """The first call after offload is enabled with a host budget below the models' sum (host copies dropped to
    their files) equals the plain run: the latents' batch-norm stats, which the blocks read outside the VAE's
    forward, are real values, not placeholders (they were NaN once)."""
    cm = ComponentsManager()
    pipe = _pipeline(flux2_repo, cm)
    images = [make_image(), make_image(1)]
    expected = [_run(pipe), _run(pipe, image=images)]
    sizes = [module_nbytes(m) for m in (pipe.transformer, pipe.vae, pipe.text_encoder)]
    for inputs, plain in zip(({}, {"image": images}), expected, strict=True):
        cm.enable_auto_cpu_offload(
            device=SimulatedDevice(sum(sizes)), memory_reserve_margin=0, host_budget=max(sizes) + 1024
        )
        try:
            assert _run(pipe, **inputs).tobytes() == plain.tobytes()
        finally:
            cm.disable_auto_cpu_offload()


def test_klein_offloaded_equals_plain(klein_repo):
    """Klein (two transformer passes a step) under a budget that forces evictions gives bit-equal images."""
    cm = ComponentsManager()
    pipe = _pipeline(klein_repo, cm)
    expected = _run(pipe, image=make_image())
    budget = max(module_nbytes(m) for m in (pipe.transformer, pipe.vae, pipe.text_encoder)) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    try:
        assert _run(pipe, image=make_image()).tobytes() == expected.tobytes()
        assert any(entry.evicted for entry in cm.offload_log)
    finally:
        cm.disable_auto_cpu_offload()
