"""Diffusers' own modular pipelines (the peer's) on our ComponentsManager, under our auto offload.

For the peer's SDXL, Flux, Qwen-Image and Wan pipelines on tiny repos: they register into our manager and
show in its table; under auto offload on a SimulatedDevice budget that forces evictions, with the plan
derived from their block tree, their outputs equal the same pipeline's without offload, no byte is copied
back, and no more bytes go to the device than the peer's own rule (smallest sufficient set, replayed on
the same uses) would move. Components are shared by load ID with our pipelines both ways.
"""

from __future__ import annotations

import shutil
import types
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from diffusers.modular_pipelines import (
    FluxAutoBlocks,
    QwenImageAutoBlocks,
    StableDiffusionXLAutoBlocks,
    WanBlocks,
)
from diffusers.modular_pipelines import (
    ModularPipeline as PeerModularPipeline,
)

import blocks.flux.tiny
import blocks.stable_diffusion_xl
from components import ComponentLoadError, ComponentsManager
from components.peer_pipelines import PlannedPeerPipeline, load_peer_components, peer_component_uses
from offload import SimulatedDevice, SmallestSufficientSet, module_nbytes
from offload.engine.replay import UseRecorder, replay

from .peer_repos import make_tiny_qwen_image_repo, make_tiny_wan_repo


@attrs.frozen
class Family:
    blocks: Callable[[], Any]  # the peer's blocks class
    make_repo: Callable[[Any], Any]
    inputs: dict[str, Any]  # text-to-image (or video) inputs that suit the tiny repo
    output: str
    models: tuple[str, ...]  # the models a text-to-image call runs, in order


FAMILIES = {
    "sdxl": Family(
        StableDiffusionXLAutoBlocks,
        blocks.stable_diffusion_xl.make_tiny_repo,
        {"height": 64, "width": 64},
        "images",
        ("text_encoder", "text_encoder_2", "vae", "unet", "vae"),
    ),
    "flux": Family(
        FluxAutoBlocks,
        blocks.flux.tiny.make_tiny_repo,
        {"height": 32, "width": 32},
        "images",
        ("text_encoder", "text_encoder_2", "transformer", "vae"),
    ),
    "qwen_image": Family(
        QwenImageAutoBlocks,
        make_tiny_qwen_image_repo,
        {"height": 32, "width": 32},
        "images",
        ("text_encoder", "transformer", "vae"),
    ),
    "wan": Family(
        WanBlocks,
        make_tiny_wan_repo,
        {"height": 16, "width": 16, "num_frames": 9, "max_sequence_length": 16},
        "videos",
        ("text_encoder", "transformer", "vae"),
    ),
}


@pytest.fixture(autouse=True)
def _wan_without_ftfy(monkeypatch):
    """The peer's Wan text encoder cleans prompts with ftfy, which is not installed here; ASCII prompts
    pass through ftfy unchanged, so an identity stand-in keeps the encoder's output as it would be."""
    import diffusers.modular_pipelines.wan.encoders as wan_encoders

    if not hasattr(wan_encoders, "ftfy"):
        monkeypatch.setattr(
            wan_encoders, "ftfy", types.SimpleNamespace(fix_text=lambda text: text), raising=False
        )


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_repo(request, tmp_path_factory):
    family = FAMILIES[request.param]
    return family, family.make_repo(tmp_path_factory.mktemp(request.param) / "tiny")


@pytest.fixture(scope="module")
def sdxl_repo(tmp_path_factory):
    return blocks.stable_diffusion_xl.make_tiny_repo(tmp_path_factory.mktemp("sdxl") / "tiny")


def _peer(family: Family, repo, manager: ComponentsManager, collection: str | None = None):
    peer = family.blocks().init_pipeline(str(repo), components_manager=manager, collection=collection)
    peer.load_components(torch_dtype=torch.float32)
    return peer


def _run(pipe, family: Family, **extra: Any) -> torch.Tensor:
    inputs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "pt", **family.inputs, **extra}
    return pipe(generator=torch.Generator("cpu").manual_seed(0), output=family.output, **inputs)


def _model_sizes(manager: ComponentsManager) -> dict[str, int]:
    return {
        component_id: module_nbytes(obj)
        for component_id, obj in manager.components.items()
        if isinstance(obj, torch.nn.Module)
    }


def _tight_budget(sizes: dict[str, int]) -> int:
    """The largest model plus half of the rest: every model fits alone, not all together."""
    largest = max(sizes.values())
    return largest + (sum(sizes.values()) - largest) // 2


# ----- registration -----


def test_peer_pipeline_registers_its_models_in_our_manager_and_table(family_repo):
    """Every model the peer's pipeline loads is registered in our manager, in its collection, and in the table."""
    family, repo = family_repo
    cm = ComponentsManager()
    peer = _peer(family, repo, cm, collection="peer")
    for name in family.models:
        component_id = cm.get_id(getattr(peer, name))
        assert component_id == f"{name}_{id(getattr(peer, name))}"
        assert cm.collections["peer"].count(component_id) == 1
        assert component_id in repr(cm)
    assert cm.search_components(family.models[0], collection="peer") == {
        family.models[0]: getattr(peer, family.models[0])
    }


def test_peer_from_pretrained_on_our_manager_runs_planned_under_offload(sdxl_repo):
    """Diffusers' ModularPipeline.from_pretrained with our manager registers, plans and runs as init_pipeline."""
    family = FAMILIES["sdxl"]
    cm = ComponentsManager()
    peer = PeerModularPipeline.from_pretrained(str(sdxl_repo), components_manager=cm, collection="sdxl")
    peer.load_components(torch_dtype=torch.float32)
    assert sorted(cm.search_components(collection="sdxl")) == sorted(
        ["text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "vae", "scheduler"]
    )
    expected = _run(peer, family)
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(_tight_budget(_model_sizes(cm))), memory_reserve_margin=0
    )
    assert torch.equal(_run(PlannedPeerPipeline(peer, cm), family), expected)
    # Victims left the device, whole or down to a resident prefix (offload.partial.shrink, on by default).
    assert any(d.evicted or d.reason == "shrink" for d in cm.offload_log)


def test_peer_unload_components_unregisters_and_detaches_from_offload(sdxl_repo):
    """The peer's unload_components removes the model from our manager and from auto offload."""
    family = FAMILIES["sdxl"]
    cm = ComponentsManager()
    peer = _peer(family, sdxl_repo, cm)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    vae = peer.vae
    assert cm.is_auto_offloaded(vae)
    peer.unload_components("vae")
    assert cm.get_id(vae) is None
    assert not hasattr(vae, "_hf_hook")


# ----- the plan -----


def test_peer_component_uses_follow_the_executed_blocks(sdxl_repo):
    """The derived uses list each executed block's components in order; an image input adds the VAE encoder."""
    family = FAMILIES["sdxl"]
    peer = family.blocks().init_pipeline(str(sdxl_repo))
    text = peer_component_uses(peer, prompt="a cat")
    assert text == [
        "text_encoder",
        "text_encoder_2",
        "tokenizer",
        "tokenizer_2",
        "guider",
        "scheduler",
        "vae",
        "unet",
        "guider",
        "scheduler",
        "guider",
        "unet",
        "scheduler",
        "vae",
        "image_processor",
    ]
    with_image = peer_component_uses(peer, prompt="a cat", image=torch.zeros(1, 3, 64, 64))
    assert with_image[: with_image.index("unet")].count("vae") == 2  # encoding the image, then its latents
    assert peer_component_uses(peer, prompt="a cat", image=None) == text  # None is not given


def test_planned_peer_pipeline_gives_the_engine_the_derived_plan(family_repo):
    """Before each call the wrapper passes the executed blocks' models, in order, to the offload engine."""
    family, repo = family_repo
    cm = ComponentsManager()
    peer = _peer(family, repo, cm)
    planned = PlannedPeerPipeline(peer, cm)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    with UseRecorder(cm.offload_engine) as recorder:
        _run(planned, family)
    plans = [value for kind, value in recorder.events if kind == "plan"]
    assert plans == [tuple(cm.get_id(getattr(peer, name)) for name in family.models)]
    assert recorder.events[0][0] == "plan"  # given before the first model ran


def test_planned_peer_pipeline_forwards_attributes_and_output(sdxl_repo):
    """The wrapper answers the peer pipeline's attributes and returns what the peer's call returns."""
    family = FAMILIES["sdxl"]
    cm = ComponentsManager()
    peer = _peer(family, sdxl_repo, cm)
    planned = PlannedPeerPipeline(peer, cm)
    assert planned.unet is peer.unet
    assert planned.load_components.__self__ is peer
    assert torch.equal(_run(planned, family), _run(peer, family))


# ----- under auto offload -----


@attrs.frozen
class OffloadFigures:
    equal: bool
    to_device: int
    to_host: int
    evictions: int
    shrinks: int  # victims shrunk to a resident prefix instead of evicted whole (offload.partial.shrink)
    peer_rule_to_device: int
    peer_rule_to_host: int


def _offload_run(family: Family, repo, planned: bool) -> OffloadFigures:
    cm = ComponentsManager()
    peer = _peer(family, repo, cm)
    baseline = _run(peer, family)
    sizes = _model_sizes(cm)
    budget = _tight_budget(sizes)
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    pipe = PlannedPeerPipeline(peer, cm) if planned else peer
    with UseRecorder(cm.offload_engine) as recorder:
        outputs = [_run(pipe, family) for _ in range(2)]  # the second call meets what the first left resident
    log = cm.offload_log
    peer_rule = replay(recorder.events, recorder.sizes, budget, 0, SmallestSufficientSet(), copies_back=True)
    return OffloadFigures(
        equal=all(torch.equal(output, baseline) for output in outputs),
        to_device=log.total_bytes_to_device,
        to_host=log.total_bytes_to_host,
        evictions=log.total_evictions,
        shrinks=[d.reason for d in log].count("shrink"),
        peer_rule_to_device=peer_rule.bytes_to_device,
        peer_rule_to_host=peer_rule.bytes_to_host,
    )


def test_peer_pipeline_under_our_auto_offload_with_the_derived_plan(family_repo):
    """Outputs equal the run without offload, victims leave the device (whole or down to a prefix), 0 bytes
    go back, and host->device bytes are no more than the peer's own rule moves on the same uses."""
    family, repo = family_repo
    figures = _offload_run(family, repo, planned=True)
    assert figures.equal
    assert figures.evictions + figures.shrinks > 0
    assert figures.to_host == 0
    assert figures.peer_rule_to_host > 0  # the peer's rule copies its victims back
    assert figures.to_device <= figures.peer_rule_to_device


def test_peer_pipeline_under_our_auto_offload_without_a_plan(sdxl_repo):
    """Unwrapped (no plan), the peer's pipeline still runs under our offload with equal outputs, 0 bytes back."""
    figures = _offload_run(FAMILIES["sdxl"], sdxl_repo, planned=False)
    assert figures.equal
    assert figures.evictions > 0
    assert figures.to_host == 0


def test_peer_and_our_pipeline_share_a_model_under_auto_offload(sdxl_repo):
    """Ours and the peer's, sharing every model, alternate under auto offload with outputs as without it."""
    family = FAMILIES["sdxl"]
    cm = ComponentsManager()
    peer = _peer(family, sdxl_repo, cm)
    ours = blocks.stable_diffusion_xl.StableDiffusionXLAutoBlocks().init_pipeline(
        sdxl_repo, components_manager=cm
    )
    ours.load_components(torch_dtype=torch.float32)
    ours.set_progress_bar_config(disable=True)
    assert ours.unet is peer.unet
    planned = PlannedPeerPipeline(peer, cm)

    def our_run():
        return ours(
            prompt="a cat",
            num_inference_steps=2,
            height=64,
            width=64,
            output="latents",
            generator=torch.Generator("cpu").manual_seed(0),
        )

    expected_ours, expected_peer = our_run(), _run(peer, family)
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(_tight_budget(_model_sizes(cm))), memory_reserve_margin=0
    )
    for _ in range(2):
        assert torch.equal(_run(planned, family), expected_peer)
        assert torch.equal(our_run(), expected_ours)
    assert cm.offload_log.total_evictions > 0
    assert cm.offload_log.total_bytes_to_host == 0


# ----- sharing by load ID -----


def test_peer_gets_the_objects_our_pipeline_loaded(sdxl_repo):
    """load_peer_components hands the peer the very objects our pipeline loaded from the same repo."""
    cm = ComponentsManager()
    ours = blocks.stable_diffusion_xl.StableDiffusionXLAutoBlocks().init_pipeline(
        sdxl_repo, components_manager=cm
    )
    ours.load_components(torch_dtype=torch.float32)
    before = dict(cm.components)
    peer = StableDiffusionXLAutoBlocks().init_pipeline(str(sdxl_repo), components_manager=cm)
    loaded = load_peer_components(peer, cm, torch_dtype=torch.float32)
    assert set(loaded) == {
        "text_encoder",
        "text_encoder_2",
        "tokenizer",
        "tokenizer_2",
        "unet",
        "vae",
        "scheduler",
    }
    for name, obj in loaded.items():
        assert obj is getattr(ours, name) is getattr(peer, name)
    assert cm.components == before  # nothing loaded twice


def test_our_pipeline_gets_the_objects_the_peer_loaded(sdxl_repo):
    """Our load_components reuses the objects the peer's own load_components registered."""
    cm = ComponentsManager()
    peer = _peer(FAMILIES["sdxl"], sdxl_repo, cm)
    ours = blocks.stable_diffusion_xl.StableDiffusionXLAutoBlocks().init_pipeline(
        sdxl_repo, components_manager=cm
    )
    ours.load_components(torch_dtype=torch.float32)
    for name in ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "vae"):
        assert getattr(ours, name) is getattr(peer, name)


def test_load_peer_components_loads_what_the_manager_lacks(sdxl_repo):
    """With an empty manager every component is loaded once, registered in the pipeline's collection."""
    cm = ComponentsManager()
    peer = StableDiffusionXLAutoBlocks().init_pipeline(
        str(sdxl_repo), components_manager=cm, collection="peer"
    )
    loaded = load_peer_components(peer, cm, names=["unet", "vae"])
    assert sorted(loaded) == ["unet", "vae"]
    assert peer.unet is loaded["unet"]
    assert peer.text_encoder is None
    assert sorted(cm.search_components(collection="peer")) == ["unet", "vae"]
    assert load_peer_components(peer, cm, names="unet")["unet"] is loaded["unet"]


# ----- bad input -----


def test_planned_peer_pipeline_refuses_what_is_not_the_peers_pipeline(sdxl_repo):
    """Our own pipeline or a foreign manager are refused with the reason."""
    cm = ComponentsManager()
    ours = blocks.stable_diffusion_xl.StableDiffusionXLAutoBlocks().init_pipeline(
        sdxl_repo, components_manager=cm
    )
    with pytest.raises(TypeError, match=r"takes a diffusers ModularPipeline .*got ModularPipeline\. Our own"):
        PlannedPeerPipeline(ours, cm)
    peer = StableDiffusionXLAutoBlocks().init_pipeline(str(sdxl_repo))
    with pytest.raises(TypeError, match=r"manager must be a components.ComponentsManager \(got dict\)"):
        PlannedPeerPipeline(peer, {})
    with pytest.raises(TypeError, match="peer_component_uses"):
        peer_component_uses(ours, prompt="a cat")


def test_load_peer_components_unknown_name_changes_nothing(sdxl_repo):
    """An unknown component name raises KeyError listing the loadable ones; nothing is loaded."""
    cm = ComponentsManager()
    peer = StableDiffusionXLAutoBlocks().init_pipeline(str(sdxl_repo), components_manager=cm)
    with pytest.raises(
        KeyError, match=r"\['guider', 'unets'\] are not components this pipeline loads .*'unet'"
    ):
        load_peer_components(peer, cm, names=["unet", "guider", "unets"])
    assert len(cm) == 0
    assert peer.unet is None


def test_load_peer_components_needs_the_pipelines_own_manager(sdxl_repo):
    """A pipeline made without this manager is refused: what it receives would be registered elsewhere."""
    peer = StableDiffusionXLAutoBlocks().init_pipeline(str(sdxl_repo), components_manager=ComponentsManager())
    cm = ComponentsManager()
    with pytest.raises(ValueError, match="made without this manager"):
        load_peer_components(peer, cm)
    assert len(cm) == 0


def test_load_peer_components_failed_load_leaves_manager_and_pipeline_as_they_were(sdxl_repo, tmp_path):
    """A component that fails to load (weights deleted) raises; what the call loaded before it is unregistered."""
    repo = shutil.copytree(sdxl_repo, tmp_path / "repo")
    for weights in (repo / "vae").glob("*.safetensors"):
        weights.unlink()
    cm = ComponentsManager()
    peer = StableDiffusionXLAutoBlocks().init_pipeline(str(repo), components_manager=cm)
    with pytest.raises(ComponentLoadError, match="vae"):
        load_peer_components(peer, cm, names=["unet", "vae"])
    assert len(cm) == 0
    assert peer.unet is None and peer.vae is None
