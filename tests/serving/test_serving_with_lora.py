"""A LoRA loaded on a served workflow's pipeline lives in its models (docs/adapters.md): it applies to the jobs
of every served workflow that shares those models (text-to-image and image-to-image of one repo), as the
manager's model info says, and to no job of another repo's workflow. With auto offload on or off."""

from __future__ import annotations

import pytest
import torch
from diffusers import StableDiffusionPipeline

from components import ComponentsManager
from modular.serving import Scheduler
from offload import SimulatedDevice, module_nbytes

from ..blocks.lora_helpers import CLIP_TARGETS, DENOISER_TARGETS, make_lora
from .durable_helpers import DirectCalls, input_image, request, result_bytes, run_all, served, tiny_repo


@pytest.fixture(scope="module")
def workflows(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "repos"
    repo, other = tiny_repo(root, "sd"), tiny_repo(root, "sd", seed=1)
    return {"t2i": (repo, None), "i2i": (repo, "image2image"), "other": (other, None)}


@pytest.fixture(scope="module")
def plain(workflows):
    return DirectCalls(workflows)


@pytest.fixture(scope="module")
def lora(plain, tmp_path_factory):
    pipe = plain.served.load("t2i")
    models = {"unet": (pipe.unet, DENOISER_TARGETS), "text_encoder": (pipe.text_encoder, CLIP_TARGETS)}
    return make_lora(tmp_path_factory.mktemp("lora") / "style", StableDiffusionPipeline, models, seed=3)


@pytest.fixture(scope="module")
def with_lora(workflows, lora):
    """The direct calls with the LoRA loaded into the repo's models (through the text-to-image pipeline)."""
    calls = DirectCalls(workflows)
    calls.served.load("t2i").load_lora_weights(lora, adapter_name="style")
    return calls


def lora_names(manager: ComponentsManager, model: torch.nn.Module) -> list[str]:
    info = manager.get_model_info(manager.get_id(model), "lora")
    return [adapter["name"] for adapter in info["lora"] or []]


@pytest.mark.parametrize("offload", [False, True], ids=["no offload", "auto offload"])
def test_a_lora_applies_to_the_jobs_of_the_models_that_hold_it(
    workflows, plain, with_lora, lora, tmp_path, offload
):
    manager = ComponentsManager()
    workflows_served = served(manager, workflows)
    if offload:  # the device holds one repo's models at a time
        for name in ("t2i", "other"):
            workflows_served.load(name)
        sizes = [
            module_nbytes(model)
            for model in manager.components.values()
            if isinstance(model, torch.nn.Module)
        ]
        manager.enable_auto_cpu_offload(device=SimulatedDevice(sum(sizes) * 3 // 4), memory_reserve_margin=0)
    scheduler = Scheduler(workflows_served, tmp_path / "state")
    image = input_image(tmp_path / "input.png")
    try:
        t2i = workflows_served.load("t2i")
        t2i.load_lora_weights(lora, adapter_name="style")
        i2i, other = workflows_served.load("i2i"), workflows_served.load("other")
        # What the manager says: the repo's UNet and text encoder hold it (both workflows run them); the other
        # repo's do not.
        for pipe in (t2i, i2i):
            assert lora_names(manager, pipe.unet) == lora_names(manager, pipe.text_encoder) == ["style"]
        assert lora_names(manager, other.unet) == lora_names(manager, other.text_encoder) == []

        def submit_all():
            return [
                (scheduler.submit(request("t2i", 1)), None),
                (scheduler.submit(request("i2i", 2, size=None, steps=2), {"image": image}), {"image": image}),
                (scheduler.submit(request("other", 3)), None),
            ]

        jobs = submit_all()
        run_all(scheduler)
        for (job, uploads), expected in zip(jobs, [with_lora, with_lora, plain]):
            assert job.state == "done", job.error
            assert result_bytes(scheduler, job.id) == expected.pngs(job.request.data, uploads), job.workflow
        assert result_bytes(scheduler, jobs[0][0].id) != plain.pngs(
            jobs[0][0].request.data
        )  # it changed them

        # Off again (for every workflow on those models): the jobs equal the plain calls.
        t2i.disable_lora()
        jobs = submit_all()
        run_all(scheduler)
        for job, uploads in jobs:
            assert result_bytes(scheduler, job.id) == plain.pngs(job.request.data, uploads), job.workflow
    finally:
        scheduler.close()
        if offload:
            manager.disable_auto_cpu_offload()
