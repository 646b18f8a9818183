"""Wan under the components manager's auto offload: unchanged outputs with evictions, and a transformer larger
than the device streamed (its resident prefix, the rest block by block), as the offload log shows."""

import torch

from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes

from ..helpers import seeded
from .conftest import VIDEO, make_image


def _pipeline(repo, cm):
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run(pipe, **extra):
    kwargs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "np", "output": "videos", **VIDEO}
    return pipe(generator=seeded(0), **kwargs, **extra)


def test_offloaded_runs_equal_plain_runs(wan22_repo, wan22_i2v_repo):
    """With room for the largest model only, both workflows and both experts give bit-equal videos."""
    cm = ComponentsManager()
    t2v, i2v = _pipeline(wan22_repo, cm), _pipeline(wan22_i2v_repo, cm)
    expected = [_run(t2v), _run(i2v, image=make_image())]
    models = [
        t2v.transformer,
        t2v.transformer_2,
        t2v.vae,
        t2v.text_encoder,
        i2v.transformer,
        i2v.transformer_2,
    ]
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(max(map(module_nbytes, models)) + 1024), memory_reserve_margin=0
    )
    try:
        assert _run(t2v).tobytes() == expected[0].tobytes()
        assert _run(i2v, image=make_image()).tobytes() == expected[1].tobytes()
        assert any(entry.evicted for entry in cm.offload_log)
    finally:
        cm.disable_auto_cpu_offload()


def test_a_transformer_larger_than_the_device_streams_and_equals_the_plain_run(wan22_repo):
    """On a device of 90 KiB each 113.66 KiB expert keeps a prefix resident and streams the rest at each of its
    forwards: the video is bit for bit the plain run's, and nothing is copied back to the host."""
    cm = ComponentsManager()
    pipe = _pipeline(wan22_repo, cm)
    expected = _run(pipe)
    budget = 90 * 1024
    assert module_nbytes(pipe.transformer) > budget and module_nbytes(pipe.transformer_2) > budget
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    try:
        assert _run(pipe).tobytes() == expected.tobytes()
        reasons = {}
        for entry in cm.offload_log:
            reasons.setdefault(entry.model_id.rsplit("_", 1)[0], []).append(entry.reason)
        # Each expert is placed once (its prefix) and streams its tail at every forward: 2 per step it takes.
        assert reasons["transformer"][0] == reasons["transformer_2"][0] == "stream"
        assert set(reasons["transformer"][1:]) == set(reasons["transformer_2"][1:]) == {"stream tail"}
        assert len(reasons["transformer"]) + len(reasons["transformer_2"]) == 2 + 2 * 3
        assert sum(entry.bytes_to_host for entry in cm.offload_log) == 0
    finally:
        cm.disable_auto_cpu_offload()
