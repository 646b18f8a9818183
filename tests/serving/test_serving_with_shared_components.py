"""Two served workflows of one repo (Stable Diffusion text-to-image and image-to-image): their components have
the same load IDs, so the manager loads each once and both pipelines run on the same objects."""

from __future__ import annotations

import pytest
import torch

from components import ComponentsManager
from components.load_id import get_load_id
from modular.errors import MissingInputError
from modular.serving import Scheduler

from .durable_helpers import DirectCalls, input_image, request, result_bytes, run_all, served, tiny_repo


@pytest.fixture(scope="module")
def workflows(tmp_path_factory):
    repo = tiny_repo(tmp_path_factory.getbasetemp() / "repos")
    return {"t2i": (repo, None), "i2i": (repo, "image2image")}


@pytest.fixture(scope="module")
def direct(workflows):
    return DirectCalls(workflows)


def test_an_image_to_image_workflow_is_served_and_its_requests_need_the_image(workflows, tmp_path):
    """A workflow that requires an input (image2image's image) is served: the input is asked of each request,
    not of the server at start-up."""
    manager = ComponentsManager()
    scheduler = Scheduler(served(manager, workflows), tmp_path / "state", prefetch=False)
    try:
        with pytest.raises(MissingInputError, match="needs image"):
            scheduler.submit(request("i2i", 1, size=None, steps=2))
        assert scheduler.jobs() == []
    finally:
        scheduler.close()


def test_text_and_image_workflows_of_one_repo_load_each_component_once(workflows, direct, tmp_path):
    manager = ComponentsManager()
    scheduler = Scheduler(served(manager, workflows), tmp_path / "state", prefetch=False)
    try:
        image = input_image(tmp_path / "input.png")
        jobs = [
            scheduler.submit(request("i2i", 5, size=None, steps=2), {"image": image}),
            scheduler.submit(request("t2i", 6)),
            scheduler.submit(request("i2i", 7, size=None, steps=2), {"image": image}),
        ]
        run_all(scheduler)
        for job in jobs:
            assert job.state == "done", job.error
            uploads = {"image": image} if job.workflow == "i2i" else None
            assert result_bytes(scheduler, job.id) == direct.pngs(job.request.data, uploads)

        models = {cid: obj for cid, obj in manager.components.items() if isinstance(obj, torch.nn.Module)}
        load_ids = sorted(get_load_id(obj) for obj in models.values())
        assert len(load_ids) == len(set(load_ids)) == 3, load_ids  # unet, vae, text encoder: each once
        t2i, i2i = scheduler.served.pipeline("t2i"), scheduler.served.pipeline("i2i")
        for name in ("unet", "vae", "text_encoder"):
            assert getattr(t2i, name) is getattr(i2i, name), name
        table = manager.table()
        for load_id in load_ids:
            assert table.count(load_id) == 1, (load_id, table)
    finally:
        scheduler.close()
