"""Pipelines in several threads on one manager under auto offload: waiting, disabling mid-call, refusing early."""

import threading

import pytest
import torch

from modular import ComponentsManager
from offload import ModelTooLargeError, SimulatedDevice, module_nbytes

from .tiny_sd import tiny_sd_pipeline


def _run(pipe, seed=0, steps=1):
    generator = torch.Generator().manual_seed(seed)
    return pipe(
        prompt="a cat", num_inference_steps=steps, generator=generator, output_type="latent", output="images"
    )


def _sizes(pipe):
    return {name: module_nbytes(getattr(pipe, name)) for name in ("text_encoder", "unet", "vae")}


def test_four_threads_share_one_manager_on_a_budget_below_the_sum_of_the_models(repo):
    """4 threads x 20 calls, every model fits alone but not with another: no error, outputs as single-threaded."""
    cm = ComponentsManager()
    pipes = [tiny_sd_pipeline(repo, cm) for _ in range(4)]
    expected = {seed: _run(pipes[0], seed) for seed in range(4)}
    sizes = _sizes(pipes[0])
    budget = max(sizes.values()) + 1024
    assert budget < sizes["unet"] + sizes["text_encoder"]
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0, wait_timeout=120)
    outputs, errors = {seed: [] for seed in range(4)}, []
    barrier = threading.Barrier(4)

    def work(seed):
        try:
            barrier.wait()
            for _ in range(20):
                outputs[seed].append(_run(pipes[seed], seed))
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(len(outputs[seed]) == 20 for seed in range(4))
    assert all(torch.equal(out, expected[seed]) for seed in range(4) for out in outputs[seed])
    assert cm.offload_engine.running_ids() == []
    assert cm.offload_engine.probe.used_bytes() <= budget


def test_disabling_offload_during_a_call_lets_the_call_finish_with_its_output(repo):
    """disable_auto_cpu_offload while a UNet forward runs waits for it; the call returns the plain output."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    expected = _run(pipe, steps=2)
    started, release = threading.Event(), threading.Event()
    unet_forward = pipe.unet.forward

    def blocking_forward(*args, **kwargs):
        started.set()
        assert release.wait(10), "the test never released the forward"
        return unet_forward(*args, **kwargs)

    pipe.unet.forward = blocking_forward  # captured by the hook as the model's own forward
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    result, errors = [], []

    def work(target, *args):
        try:
            result.append(target(*args))
        except BaseException as error:  # surfaced below
            errors.append(error)

    runner = threading.Thread(target=work, args=(_run, pipe, 0, 2))
    runner.start()
    assert started.wait(10)
    disabler = threading.Thread(target=work, args=(cm.disable_auto_cpu_offload,))
    disabler.start()
    disabler.join(0.3)
    assert disabler.is_alive(), "disable must wait for the forward in progress"
    release.set()
    runner.join(20)
    disabler.join(20)
    assert errors == []
    assert torch.equal(next(r for r in result if r is not None), expected)
    assert not cm.auto_offload_enabled
    assert all(getattr(m, "_hf_hook", None) is None for m in (pipe.unet, pipe.vae, pipe.text_encoder))


def test_a_call_whose_model_cannot_fit_alone_fails_before_any_model_moves(repo):
    """When the UNet cannot fit even alone, the call raises at its plan: nothing was moved in for it."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    sizes = _sizes(pipe)
    budget = sum(sizes.values())
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    cm.offload_engine.memory_reserve_margin = budget - sizes["vae"]  # room for the VAE, not the UNet
    unet_id = cm.get_id(pipe.unet)
    # A model too large to place whole is streamed group by group; this one's largest group does not fit either.
    with pytest.raises(
        ModelTooLargeError,
        match=f"model '{unet_id}' cannot fit on sim .* even streamed group by group: .* Nothing was moved",
    ):
        _run(pipe)
    assert len(cm.offload_log) == 0
