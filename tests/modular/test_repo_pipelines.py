"""Pipelines bound to repos: lazy from_pretrained, loading through a manager, save/load round trips."""

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
from diffusers.modular_pipelines import ComponentSpec as PeerSpec
from diffusers.modular_pipelines import ModularPipelineBlocks as PeerBlocks
from transformers import CLIPTextModel, CLIPTokenizer

from blocks.stable_diffusion import StableDiffusionAutoBlocks, make_tiny_repo
from components import ComponentSpec
from modular import ComponentsManager, ModularPipeline
from modular.pipeline.index import MODULAR_INDEX

from .tiny_sd import tiny_sd_latents


def test_from_pretrained_reads_the_classic_index_lazily(repo):
    """from_pretrained maps the classic _class_name to the family's blocks and loads no weights."""
    pipe = ModularPipeline.from_pretrained(repo)
    assert isinstance(pipe.blocks, StableDiffusionAutoBlocks)
    assert set(pipe.null_component_names) == {"unet", "vae", "text_encoder", "tokenizer", "scheduler"}
    spec = pipe.get_component_spec("unet")
    assert spec.type_hint is UNet2DConditionModel
    assert spec.load_id == f"{repo}|unet|null|null"


def test_workflow_prunes_the_blocks(repo):
    """workflow='text2image' keeps only the blocks that run for text-to-image."""
    pipe = ModularPipeline.from_pretrained(repo, workflow="text2image")
    names = list(pipe.blocks.sub_blocks)
    assert not any("vae_encoder" in name or "inpaint" in name for name in names), names
    assert set(pipe.pretrained_component_names) == {"text_encoder", "tokenizer", "unet", "scheduler", "vae"}


def test_two_pipelines_share_components_and_the_second_loads_nothing(repo, monkeypatch):
    """A second pipeline from the same repo on one manager reuses every model: no load call."""
    cm = ComponentsManager()
    first = ModularPipeline.from_pretrained(repo, components_manager=cm)
    first.load_components(torch_dtype=torch.float32)
    calls = []
    original = ComponentSpec.load
    monkeypatch.setattr(
        ComponentSpec, "load", lambda self, **kw: calls.append(self.name) or original(self, **kw)
    )
    second = ModularPipeline.from_pretrained(repo, components_manager=cm, workflow="image2image")
    second.load_components(torch_dtype=torch.float32)
    assert calls == []
    for name in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert getattr(second, name) is getattr(first, name)
    table = cm.table()
    assert table.count("UNet2DConditionModel") == 1


def test_load_components_takes_per_component_options(repo):
    """A dict option applies per component name, with 'default' for the rest."""
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(["unet", "vae"], torch_dtype={"unet": torch.float16, "default": torch.float32})
    assert pipe.unet.dtype == torch.float16 and pipe.vae.dtype == torch.float32
    assert set(pipe.null_component_names) == {"text_encoder", "tokenizer", "scheduler"}


def test_a_failed_load_registers_nothing(repo, monkeypatch):
    """If one component fails to load, none of this call's components stays registered or set."""
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    with pytest.raises(Exception, match="subfolder"):
        pipe.load_components(["unet", "vae"], subfolder={"vae": "no_such_folder"})
    assert pipe.unet is None and pipe.vae is None
    assert all(not cid.startswith(("unet_", "vae_")) for cid in cm.components)


def test_unknown_component_in_load_components_lists_the_known_ones(repo):
    """load_components(['nope']) raises a KeyError listing the pipeline's components."""
    pipe = ModularPipeline.from_pretrained(repo)
    with pytest.raises(KeyError, match=r"unknown component\(s\) \['nope'\]"):
        pipe.load_components(["nope"])


def test_save_then_load_gives_an_equal_pipeline(repo, tmp_path):
    """ours -> save_pretrained -> from_pretrained: same specs (pointing at the folder), same outputs."""
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.save_pretrained(tmp_path / "saved")
    index = json.loads((tmp_path / "saved" / MODULAR_INDEX).read_text())
    assert index["_blocks_class_name"] == "StableDiffusionAutoBlocks"
    assert index["unet"][0:2] == ["diffusers", "UNet2DConditionModel"]
    assert index["unet"][2]["subfolder"] == "unet"
    again = ModularPipeline.from_pretrained(tmp_path / "saved")
    again.load_components(torch_dtype=torch.float32)
    assert again.get_component_spec("unet").load_id == f"{(tmp_path / 'saved').resolve()}|unet|null|null"
    assert torch.equal(tiny_sd_latents(pipe), tiny_sd_latents(again))


def test_saved_workflow_stays_pruned(repo, tmp_path):
    """A pruned workflow is saved as such and comes back pruned (not the full default blocks)."""
    pipe = ModularPipeline.from_pretrained(repo, workflow="text2image")
    pipe.load_components(torch_dtype=torch.float32)
    pipe.save_pretrained(tmp_path / "t2i")
    again = ModularPipeline.from_pretrained(tmp_path / "t2i")
    assert list(again.blocks.sub_blocks) == list(pipe.blocks.sub_blocks)


def test_unload_components_frees_the_memory(repo):
    """unload_components drops the pipeline's and the manager's references: the model is collected."""
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(["unet"], torch_dtype=torch.float32)
    ref = weakref.ref(pipe.unet)
    pipe.unload_components("unet")
    gc.collect()
    assert ref() is None
    assert pipe.unet is None
    assert not any(cid.startswith("unet_") for cid in cm.components)


class PeerNeeds(PeerBlocks):
    """A block written for diffusers' modular system that needs the SD components."""

    expected_components = [
        PeerSpec("unet", UNet2DConditionModel),
        PeerSpec("vae", AutoencoderKL),
        PeerSpec("text_encoder", CLIPTextModel),
        PeerSpec("tokenizer", CLIPTokenizer),
        PeerSpec("scheduler", PNDMScheduler),
    ]

    def __call__(self, components, state):
        return components, state


def _fields(spec):
    return (spec.pretrained_model_name_or_path, spec.subfolder, spec.variant, spec.revision, spec.type_hint)


def test_an_index_written_by_diffusers_reads_here(repo, tmp_path):
    """diffusers' modular save_pretrained writes an index whose specs read here equal, and whose components load."""
    peer = PeerNeeds().init_pipeline(str(repo))
    peer.load_components(torch_dtype=torch.float32)
    peer.save_pretrained(str(tmp_path / "peer"), overwrite_modular_index=True)
    written = json.loads((tmp_path / "peer" / MODULAR_INDEX).read_text())
    ours = StableDiffusionAutoBlocks().init_pipeline(tmp_path / "peer")
    for name in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        entry = written[name][2]
        expected = tuple(
            entry[k] for k in ("pretrained_model_name_or_path", "subfolder", "variant", "revision")
        )
        assert _fields(ours.get_component_spec(name)) == (*expected, type(getattr(peer, name))), name
    ours.load_components(torch_dtype=torch.float32)
    assert ours.null_component_names == []
    assert torch.equal(ours.unet.conv_in.weight, peer.unet.conv_in.weight)


def test_an_index_written_here_reads_in_diffusers(repo, tmp_path):
    """Our modular_model_index.json loads in diffusers' modular system with equal specs."""
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.save_pretrained(tmp_path / "ours")
    peer = PeerNeeds().init_pipeline(str(tmp_path / "ours"))
    saved = str(Path(tmp_path / "ours").resolve())
    for name in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert _fields(peer.get_component_spec(name)) == (saved, name, None, None, type(getattr(pipe, name)))
    peer.load_components(torch_dtype=torch.float32)
    assert torch.equal(peer.unet.conv_in.weight, pipe.unet.conv_in.weight)


def test_missing_repo_is_a_clear_error(tmp_path):
    """from_pretrained on a folder without an index says so."""
    with pytest.raises(FileNotFoundError, match="neither modular_model_index.json nor model_index.json"):
        ModularPipeline.from_pretrained(tmp_path)


def test_unknown_hub_repo_offline_is_a_clear_error():
    """An uncached hub id with HF_HUB_OFFLINE=1 names the repo and the offline mode."""
    with pytest.raises(FileNotFoundError, match=r"org/not-there: cannot read .* offline"):
        ModularPipeline.from_pretrained("org/not-there")


def test_a_failed_load_keeps_components_that_were_registered_before(repo):
    """A failing load_components removes only what it added; shared components stay registered."""
    cm = ComponentsManager()
    first = ModularPipeline.from_pretrained(repo, components_manager=cm)
    first.load_components(["unet"], torch_dtype=torch.float32)
    second = ModularPipeline.from_pretrained(repo, components_manager=cm)
    with pytest.raises(Exception, match="subfolder"):
        second.load_components(["unet", "text_encoder", "vae"], subfolder={"vae": "no_such_folder"})
    assert cm.get_id(first.unet) is not None
    assert not any(cid.startswith("text_encoder_") for cid in cm.components)


def test_to_moves_every_model(repo):
    """pipe.to(dtype) converts every model component and returns the pipeline."""
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(["unet", "vae"], torch_dtype=torch.float32)
    assert pipe.to(torch.float16) is pipe
    assert pipe.unet.dtype == torch.float16 and pipe.vae.dtype == torch.float16
    assert pipe.dtype == torch.float16 and pipe.device == torch.device("cpu")


def test_lora_adapters_show_in_the_manager(repo):
    """A LoRA adapter added to a loaded UNet appears in the manager's model info and table."""
    from peft import LoraConfig

    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(["unet"], torch_dtype=torch.float32)
    pipe.unet.add_adapter(LoraConfig(r=2, target_modules=["to_q", "to_v"]), adapter_name="style")
    unet_id = cm.get_id(pipe.unet)
    assert cm.get_model_info(unet_id, "adapters") == {"adapters": ["style"]}
    assert f"{unet_id}:\n  Adapters: ['style']" in cm.table()


def test_each_component_may_point_at_a_different_repo(repo, tmp_path):
    """A modular index whose unet lives in another repo loads each component from its own repo."""
    other = make_tiny_repo(tmp_path / "other", seed=7)
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.save_pretrained(tmp_path / "mixed")
    index_path = tmp_path / "mixed" / MODULAR_INDEX
    index = json.loads(index_path.read_text())
    index["unet"][2].update(pretrained_model_name_or_path=str(other), subfolder="unet")
    index_path.write_text(json.dumps(index))
    mixed = ModularPipeline.from_pretrained(tmp_path / "mixed")
    mixed.load_components(torch_dtype=torch.float32)
    reference = UNet2DConditionModel.from_pretrained(other, subfolder="unet")
    assert mixed.get_component_spec("unet").load_id == f"{other}|unet|null|null"
    assert torch.equal(mixed.unet.conv_in.weight, reference.conv_in.weight)
    assert torch.equal(mixed.vae.decoder.conv_out.weight, pipe.vae.decoder.conv_out.weight)


def test_loading_options_at_from_pretrained_name_load_components(repo):
    """`from_pretrained(repo, torch_dtype=...)`, a diffusers habit, is refused with the call that takes it
    (`load_components`), as is `init_pipeline(repo, variant=...)`; nothing is registered with the manager."""
    cm = ComponentsManager()
    with pytest.raises(
        TypeError, match=r"torch_dtype=\.\.\.: making a pipeline loads no weights; pass it to "
    ):
        ModularPipeline.from_pretrained(repo, components_manager=cm, torch_dtype=torch.float16)
    with pytest.raises(TypeError, match=r"pipe\.load_components\(variant=\.\.\.\)"):
        StableDiffusionAutoBlocks().init_pipeline(repo, components_manager=cm, variant="fp16")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'colection'"):
        ModularPipeline.from_pretrained(repo, colection="x")
    assert len(cm) == 0
