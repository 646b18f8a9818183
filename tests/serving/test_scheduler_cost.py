"""What a job costs to start: the bytes its pipeline's models would bring to the device now (cost.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from modular.pipeline.index import MODULAR_INDEX
from modular.serving import ServedWorkflow, ServedWorkflows
from modular.serving.cost import bytes_to_bring
from offload import SimulatedDevice, module_nbytes

from .conftest import SMALL, drain

MODELS = ("text_encoder", "unet", "vae")  # the SD pipeline's models


def _weight_files(repo: Path, *subfolders: str) -> int:
    return sum(path.stat().st_size for name in subfolders for path in (repo / name).glob("*.safetensors"))


@pytest.fixture(scope="module")
def twin(serving_repos, tmp_path_factory):
    """A repo with an index only: its text encoder and VAE are the SD repo's (the same load IDs), its UNet
    another repo's (other weights)."""
    folder = tmp_path_factory.mktemp("twin")
    other = make_tiny_repo(folder / "other-sd", seed=1)
    twin = folder / "twin"
    twin.mkdir()
    index = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0"}
    base = json.loads((serving_repos["sd"] / "model_index.json").read_text())
    for name, value in base.items():
        if name.startswith("_") or not isinstance(value, list) or value == [None, None]:
            continue
        library, cls = value
        source = other if name == "unet" else serving_repos["sd"]
        index[name] = [
            library,
            cls,
            {"pretrained_model_name_or_path": str(source), "subfolder": name, "type_hint": [library, cls]},
        ]
    (twin / MODULAR_INDEX).write_text(json.dumps(index))
    return {"twin": twin, "other": other}


def _served(workflows, manager, *names, extra=()):
    return ServedWorkflows([*(workflows[name] for name in names), *extra], manager)


def _engine(manager):
    (engine,) = manager.offload_engines
    return engine


def test_a_workflow_not_loaded_costs_its_weight_files(workflows, serving_repos):
    served = _served(workflows, ComponentsManager(), "sd", "flux")
    assert bytes_to_bring(served.manager, served.pipeline("sd")) == _weight_files(
        serving_repos["sd"], *MODELS
    )
    flux = ("text_encoder", "text_encoder_2", "transformer", "vae")
    assert bytes_to_bring(served.manager, served.pipeline("flux")) == _weight_files(
        serving_repos["flux"], *flux
    )


def test_a_resident_workflow_costs_nothing(make_scheduler, sizes):
    scheduler = make_scheduler("sd", budget=sizes["sd"])
    scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    pipe = scheduler.served.pipeline("sd")
    assert all(
        _engine(scheduler.manager).residency(scheduler.manager.get_id(getattr(pipe, name))).resident
        for name in MODELS
    )
    assert scheduler.cost("sd") == bytes_to_bring(scheduler.manager, pipe) == 0


def test_evicted_models_cost_their_bytes(make_scheduler, sizes):
    scheduler = make_scheduler("sd", budget=sizes["sd"])
    scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    pipe, manager = scheduler.served.pipeline("sd"), scheduler.manager
    engine = _engine(manager)
    engine.evict(manager.get_id(pipe.unet))
    assert scheduler.cost("sd") == module_nbytes(pipe.unet) == engine.nbytes(manager.get_id(pipe.unet))
    for name in MODELS:
        engine.evict(manager.get_id(getattr(pipe, name)))
    assert scheduler.cost("sd") == sizes["sd"]


def test_the_cost_is_what_the_job_then_moves_to_the_device(make_scheduler, sizes):
    """On a device that holds one family, a Flux job after an SD job evicts (or shrinks) SD's models; the
    SD job after it moves to the device exactly the bytes its cost said."""
    scheduler = make_scheduler("sd", "flux", budget=max(sizes["sd"], sizes["flux"]), prefetch=False)
    for workflow in ("sd", "flux"):
        scheduler.submit({**SMALL, "workflow": workflow, "seed": 1})
        drain(scheduler)
    engine = _engine(scheduler.manager)
    cost = scheduler.cost("sd")
    assert 0 < cost < sizes["sd"]
    moved = engine.log.total_bytes_to_device
    scheduler.submit({**SMALL, "workflow": "sd", "seed": 2})
    drain(scheduler)
    assert engine.log.total_bytes_to_device - moved == cost
    assert scheduler.cost("sd") == 0 and scheduler.cost("flux") > 0


def test_without_offload_loaded_models_cost_nothing(make_scheduler, serving_repos):
    scheduler = make_scheduler("sd", "flux")
    assert scheduler.cost("sd") == _weight_files(serving_repos["sd"], *MODELS)
    scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    assert scheduler.cost("sd") == 0
    assert scheduler.cost("flux") > 0  # still on disk


def test_models_shared_by_load_id_count_as_loaded_for_every_repo(workflows, serving_repos, twin, sizes):
    """The twin repo shares SD's text encoder and VAE: once SD's are resident it costs only its own UNet,
    read from its files; and the image2image workflow of the SD repo costs nothing at all."""
    manager = ComponentsManager()
    manager.enable_auto_cpu_offload(device=SimulatedDevice(2 * sizes["sd"]), memory_reserve_margin=0)
    served = _served(workflows, manager, "sd", "sd-i2i", extra=[ServedWorkflow("twin", str(twin["twin"]))])
    sd_files = _weight_files(serving_repos["sd"], *MODELS)
    assert bytes_to_bring(manager, served.pipeline("twin")) == _weight_files(
        serving_repos["sd"], "text_encoder", "vae"
    ) + _weight_files(twin["other"], "unet")
    assert bytes_to_bring(manager, served.pipeline("sd-i2i")) == sd_files
    pipe = served.load("sd")
    engine = _engine(manager)
    for name in MODELS:
        engine.place_if_room(manager.get_id(getattr(pipe, name)))
    assert bytes_to_bring(manager, served.pipeline("twin")) == _weight_files(twin["other"], "unet")
    assert bytes_to_bring(manager, served.pipeline("sd-i2i")) == 0
    engine.evict(manager.get_id(pipe.vae))
    # the shared VAE is counted once for each pipeline that would bring it, whoever loaded it
    assert bytes_to_bring(manager, served.pipeline("twin")) == _weight_files(
        twin["other"], "unet"
    ) + module_nbytes(pipe.vae)
    assert bytes_to_bring(manager, served.pipeline("sd-i2i")) == module_nbytes(pipe.vae)


def test_a_repo_that_is_neither_a_folder_nor_cached_costs_nothing_to_read(tmp_path):
    from modular.serving.cost import file_bytes

    assert file_bytes(str(tmp_path / "gone"), "unet") == 0
    assert file_bytes("nobody/no-such-repo-here", None) == 0
    shutil.rmtree(tmp_path, ignore_errors=True)
