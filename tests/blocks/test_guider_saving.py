"""A swapped guider is saved in the index in the peer's layout and made again, from its config, on load.

The layout (modular/pipeline/config_components.py): ``<folder>/guider/guider_config.json`` and an index entry
``[library, class, {pretrained_model_name_or_path: null, subfolder: "guider", ..., type_hint}]``, which the
peer loads with the class's ``from_pretrained``. A pipeline's default guider is not written, as the peer does.
"""

import json
import logging
import shutil

import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance, LTX2Guidance, PerturbedAttentionGuidance
from diffusers.hooks import LayerSkipConfig
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

import blocks.flux
import blocks.flux2
import blocks.qwenimage
import blocks.sd3
import blocks.stable_diffusion
import blocks.stable_diffusion_xl
import blocks.wan
import blocks.z_image
import modular
from components import ComponentsManager
from modular import ModularPipeline
from modular.errors import IndexFileError
from modular.pipeline.config_components import changed_config_components
from modular.pipeline.index import MODULAR_INDEX

from ..modular.saved import saved_index
from .helpers import seeded

FAMILIES = (
    blocks.stable_diffusion,
    blocks.stable_diffusion_xl,
    blocks.flux,
    blocks.z_image,
    blocks.flux2,
    blocks.sd3,
    blocks.qwenimage,
    blocks.wan,
)
for _family in FAMILIES:
    modular.register_family(_family.FAMILY)
logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

MID = "mid_block.attentions.0.transformer_blocks"


def pag(indices=(0,)) -> PerturbedAttentionGuidance:
    config = LayerSkipConfig(
        indices=list(indices), fqn=MID, skip_attention=False, skip_attention_scores=True, skip_ff=False
    )
    return PerturbedAttentionGuidance(
        guidance_scale=6.0,
        perturbed_guidance_scale=3.0,
        perturbed_guidance_start=-1.0,
        perturbed_guidance_stop=1.0,
        perturbed_guidance_config=config,
    )


def public_config(guider) -> dict:
    """The guider's config as its file holds it (layer configs as dicts), without the private keys."""
    return {k: v for k, v in json.loads(guider.to_json_string()).items() if not k.startswith("_")}


def run(pipe):
    inputs = {"prompt": "a cat", "num_inference_steps": 2, "output_type": "latent"}
    return pipe(generator=seeded(0), output="images", **inputs)


@pytest.fixture(scope="module")
def sd_repo(tmp_path_factory):
    return blocks.stable_diffusion.make_tiny_repo(tmp_path_factory.mktemp("guider-saving") / "tiny-sd")


@pytest.fixture
def sd(sd_repo):
    pipe = ModularPipeline.from_pretrained(sd_repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def saved_with_pag(sd, tmp_path):
    """The SD pipeline with a PAG guider, saved; and its output before the save."""
    sd.update_components(guider=pag())
    expected = run(sd)
    folder = tmp_path / "saved"
    sd.save_pretrained(folder)
    return folder, expected


def reopen(folder, cm=None):
    pipe = ModularPipeline.from_pretrained(folder, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.FAMILY.name)
def test_a_default_pipeline_changes_no_config_component(family, tmp_path):
    """Each family's pipeline as its blocks make it has nothing from a config to save (the peer's index)."""
    pipe = family.FAMILY.blocks_class().init_pipeline(family.make_tiny_repo(tmp_path / "tiny"))
    assert changed_config_components(pipe) == []


def test_the_default_guider_is_not_written(sd, tmp_path):
    """A save of a pipeline with its default guider writes no guider folder and no guider entry."""
    sd.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved" / "guider").exists()
    assert "guider" not in saved_index(tmp_path / "saved")


def test_a_swapped_guider_is_written_in_the_peers_layout(saved_with_pag):
    """The guider's config file in guider/ and an entry pointing at it, naming its class."""
    folder, _ = saved_with_pag
    assert saved_index(folder)["guider"] == [
        "diffusers",
        "PerturbedAttentionGuidance",
        {
            "pretrained_model_name_or_path": None,
            "subfolder": "guider",
            "variant": None,
            "revision": None,
            "type_hint": ["diffusers", "PerturbedAttentionGuidance"],
        },
    ]
    saved = json.loads((folder / "guider" / "guider_config.json").read_text())
    assert saved["_class_name"] == "PerturbedAttentionGuidance"
    assert saved["perturbed_guidance_config"]["fqn"] == MID


def test_a_saved_pag_guider_comes_back_with_its_config_and_output(saved_with_pag):
    """from_pretrained of the saved folder: the same guider class and config, made from config, same output."""
    folder, expected = saved_with_pag
    pipe = reopen(folder)
    assert type(pipe.guider) is PerturbedAttentionGuidance
    assert public_config(pipe.guider) == public_config(pag())
    assert pipe.get_component_spec("guider").default_creation_method == "from_config"
    assert torch.equal(run(pipe), expected)


def test_a_saved_guider_is_each_pipelines_own(saved_with_pag):
    """Two pipelines from the saved folder on one manager share the UNet, not the guider; swapping one's
    guider leaves the other's calls as they were."""
    folder, expected = saved_with_pag
    cm = ComponentsManager()
    first, second = reopen(folder, cm), reopen(folder, cm)
    assert first.unet is second.unet and first.guider is not second.guider
    first.update_components(guider=ClassifierFreeGuidance(guidance_scale=7.5))
    assert type(second.guider) is PerturbedAttentionGuidance
    assert torch.equal(run(second), expected)


def test_the_peer_loads_our_saved_guider(tmp_path):
    """diffusers' modular pipeline reads our SDXL save with a PAG guider: the same class and config."""
    repo = blocks.stable_diffusion_xl.make_tiny_repo(tmp_path / "tiny-sdxl")
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.update_components(guider=pag(indices=(0, 1)))
    pipe.save_pretrained(tmp_path / "saved")
    peer = PeerPipeline.from_pretrained(str(tmp_path / "saved"))
    peer.load_components(torch_dtype=torch.float32)
    assert type(peer.guider) is PerturbedAttentionGuidance
    assert public_config(peer.guider) == public_config(pag(indices=(0, 1)))


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        (
            ["diffusers", "NoSuchGuidance"],
            r"modular_model_index.json: entry 'guider': Library 'diffusers' has no class 'NoSuchGuidance'",
        ),
        (
            ["diffusers", "AutoencoderKL"],
            r"entry 'guider' declares diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL, which cannot "
            r"be the 'guider' component: its blocks take a BaseGuidance",
        ),
    ],
    ids=["unknown-class", "not-a-guider"],
)
def test_a_bad_guider_class_in_a_saved_index_is_refused_and_nothing_loaded(saved_with_pag, classes, message):
    """An unknown class, or one that is no guider, in the guider entry: an IndexFileError naming the file and the
    entry; no pipeline, nothing registered with the manager."""
    folder, _ = saved_with_pag
    index = saved_index(folder)
    index["guider"] = [*classes, {**index["guider"][2], "type_hint": classes}]
    (folder / MODULAR_INDEX).write_text(json.dumps(index))
    cm = ComponentsManager()
    with pytest.raises(IndexFileError, match=message):
        ModularPipeline.from_pretrained(folder, components_manager=cm)
    assert cm.components == {}


def test_a_missing_guider_config_is_refused(saved_with_pag):
    """The entry's config file gone: an IndexFileError naming the entry, the file and the fix."""
    folder, _ = saved_with_pag
    shutil.rmtree(folder / "guider")
    with pytest.raises(IndexFileError, match=r"entry 'guider': cannot read the guider_config.json of "):
        ModularPipeline.from_pretrained(folder)


def test_a_saved_guider_the_family_cannot_serve_is_refused_before_anything_loads(saved_with_pag):
    """A saved LTX2Guidance (whose extra predictions SD's denoiser cannot make): a ValueError naming them when
    the pipeline is made, before any weights load; nothing registered with the manager."""
    folder, _ = saved_with_pag
    LTX2Guidance(guidance_scale=3.0, stg_scale=1.0).save_pretrained(str(folder / "guider"))
    index = saved_index(folder)
    index["guider"] = [
        "diffusers",
        "LTX2Guidance",
        {**index["guider"][2], "type_hint": ["diffusers", "LTX2Guidance"]},
    ]
    (folder / MODULAR_INDEX).write_text(json.dumps(index))
    cm = ComponentsManager()
    with pytest.raises(
        ValueError, match=r"LTX2Guidance asks for predictions \['pred_cond_stg', 'pred_cond_modality'\]"
    ):
        ModularPipeline.from_pretrained(folder, components_manager=cm)
    assert cm.components == {}
