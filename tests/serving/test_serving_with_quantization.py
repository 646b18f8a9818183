"""A served workflow whose UNet is loaded quantized (torchao int8 weight-only, docs/quantization.md): its jobs
equal the direct call on the same quantized load, with auto offload off and on (the quantized UNet moves by
its inner tensors); the quantized call differs from the plain one."""

from __future__ import annotations

import pytest
import torch

from components import ComponentsManager
from modular.serving import Scheduler
from offload import SimulatedDevice, module_nbytes

from .durable_helpers import DirectCalls, request, result_bytes, run_all, served, tiny_repo

torchao = pytest.importorskip("torchao")


def int8_unet() -> dict:
    from diffusers import TorchAoConfig
    from torchao.quantization import Int8WeightOnlyConfig

    return {"unet": TorchAoConfig(Int8WeightOnlyConfig()), "default": None}


def quantize_unet(calls_or_served, name: str) -> None:
    pipe = calls_or_served.load(name)
    pipe.load_components(["unet"], torch_dtype=torch.float32, quantization_config=int8_unet())


@pytest.fixture(scope="module")
def workflows(tmp_path_factory):
    return {"sd": (tiny_repo(tmp_path_factory.getbasetemp() / "repos", "sd"), None)}


@pytest.fixture(scope="module")
def plain(workflows):
    return DirectCalls(workflows)


@pytest.fixture(scope="module")
def quantized(workflows):
    calls = DirectCalls(workflows)
    quantize_unet(calls.served, "sd")
    return calls


@pytest.mark.parametrize("offload", [False, True], ids=["no offload", "auto offload"])
def test_jobs_of_a_quantized_unet_equal_the_direct_quantized_call(
    workflows, plain, quantized, tmp_path, offload
):
    manager = ComponentsManager()
    workflows_served = served(manager, workflows)
    quantize_unet(workflows_served, "sd")
    info = manager.get_model_info(manager.get_id(workflows_served.pipeline("sd").unet), "quantization")
    assert info["quantization"]["method"] == "torchao", info
    if offload:  # room for the UNet and one more model at a time
        sizes = sorted(
            module_nbytes(model)
            for model in manager.components.values()
            if isinstance(model, torch.nn.Module)
        )
        manager.enable_auto_cpu_offload(
            device=SimulatedDevice(sizes[-1] + sizes[-2]), memory_reserve_margin=0
        )
    scheduler = Scheduler(workflows_served, tmp_path / "state")
    try:
        jobs = [scheduler.submit(request("sd", seed)) for seed in (1, 2)]
        run_all(scheduler)
        for job in jobs:
            assert job.state == "done", job.error
            assert result_bytes(scheduler, job.id) == quantized.pngs(job.request.data)
        data = jobs[0].request.data  # quantizing changed the call (by less than a PNG's rounding, here)
        assert not (quantized.arrays(data)[0] == plain.arrays(data)[0]).all()
        if offload:
            assert manager.offload_log.total_evictions > 0  # the models took turns on the device
    finally:
        scheduler.close()
        if offload:
            manager.disable_auto_cpu_offload()
