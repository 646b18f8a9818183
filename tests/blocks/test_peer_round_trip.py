"""Index files round-trip with the peer (diffusers' modular pipelines) for SDXL, Flux, Z-Image, Flux.2, SD3,
Qwen-Image and Wan.

peer -> ours: the peer's pipeline on a tiny classic repo loads and saves; ours reads that folder, picks
our family's blocks, takes every spec from the index, loads, and equals the classic pipeline.
ours -> peer: ours saves; the peer reads that folder into its own family pipeline, loads every
component, and runs on them (Flux and CFG-free Z-Image bit for bit; SDXL only to ~1e-5, see below).
"""

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from diffusers import FluxPipeline
from diffusers.guiders import ClassifierFreeGuidance
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

import blocks.flux
import blocks.flux2
import blocks.qwenimage
import blocks.sd3
import blocks.stable_diffusion_xl
import blocks.wan
import blocks.z_image
import modular
from components.load_id import LOAD_ID_FIELDS

from ..modular.saved import saved_index
from .flux.conftest import classic_from as flux_classic
from .flux2.conftest import KLEIN
from .flux2.conftest import classic_from as flux2_classic
from .qwenimage.conftest import classic_from as qwenimage_classic
from .sd3.conftest import classic_from as sd3_classic
from .stable_diffusion_xl.conftest import classic_from as sdxl_classic
from .wan.conftest import classic_from as wan_classic
from .z_image.conftest import classic_from as zimage_classic


def _generator() -> torch.Generator:
    return torch.Generator("cpu").manual_seed(0)


def _check_sdxl(pipe, peer, inputs):
    """SDXL: at the same guidance scale the peer agrees with ours to 1e-4, not bit for bit.

    The peer runs the conditional and unconditional UNet passes as separate batches; the classic
    pipeline (and ours, equal to it) runs them as one batch of two, so the float sums differ (~1e-5).
    The peer's default guidance scale is 7.5, the classic one 5.0: both get 5.0 here.
    """
    peer.update_components(guider=ClassifierFreeGuidance(guidance_scale=5.0))
    theirs = peer(generator=_generator(), output="latents", **inputs)
    ours = pipe(generator=_generator(), output="latents", guidance_scale=5.0, **inputs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def _check_flux(pipe, peer, inputs):
    """Flux: the peer's latents equal ours bit for bit, once ours (packed, as classic) are unpacked."""
    theirs = peer(generator=_generator(), output="latents", **inputs)
    packed = pipe(generator=_generator(), output="latents", **inputs)
    ours = FluxPipeline._unpack_latents(packed, inputs["height"], inputs["width"], peer.vae_scale_factor)
    assert torch.equal(ours, theirs)


def _check_z_image(pipe, peer, inputs):
    """Z-Image: the peer with guidance off (its default) equals ours with guidance_scale=0 bit for bit.

    With guidance on they differ: the classic formula (which ours follows) at scale s is the peer's
    classifier-free guidance at s + 1, and even then they agree only to ~5e-6.
    """
    peer.update_components(guider=ClassifierFreeGuidance(guidance_scale=5.0, enabled=False))
    theirs = peer(generator=_generator(), output="latents", **inputs)
    ours = pipe(generator=_generator(), output="latents", guidance_scale=0.0, **inputs)
    assert torch.equal(ours, theirs)


klein_classic = KLEIN.classic_from


def _check_flux2(pipe, peer, inputs):
    """Flux.2: the peer's latents equal ours bit for bit (ours unpacked by their position ids) once its text
    encoder step is given the classic system message; its own lacks the classic message's line break, which
    changes the prompt embeddings."""
    from diffusers.modular_pipelines.flux2.encoders import Flux2TextEncoderStep
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    from blocks.flux2.utils import unpack_latents_with_ids

    packed = pipe(generator=_generator(), output=["images", "latent_ids"], **inputs)
    ours = unpack_latents_with_ids(packed["images"], packed["latent_ids"])
    own = Flux2TextEncoderStep.DEFAULT_SYSTEM_MESSAGE
    assert own != SYSTEM_MESSAGE and own == " ".join(SYSTEM_MESSAGE.split())
    assert not torch.equal(ours, peer(generator=_generator(), output="latents", **inputs))
    Flux2TextEncoderStep.DEFAULT_SYSTEM_MESSAGE = SYSTEM_MESSAGE
    try:
        theirs = peer(generator=_generator(), output="latents", **inputs)
    finally:
        Flux2TextEncoderStep.DEFAULT_SYSTEM_MESSAGE = own
    assert torch.equal(ours, theirs)


def _check_flux2_klein(pipe, peer, inputs):
    """Flux.2 Klein (base): the peer's images, classifier-free guided by its guider, equal ours bit for bit."""
    inputs = {**inputs, "output_type": "pt"}
    theirs = peer(generator=_generator(), output="images", **inputs)
    assert torch.equal(pipe(generator=_generator(), output="images", **inputs), theirs)


def _check_sd3(pipe, peer, inputs):
    """SD3: the peer without a negative prompt (it then runs one pass, unguided) equals ours with guidance_scale=1
    bit for bit; with a negative prompt both guide at 7.0, to ~1e-5 (the peer runs the conditional and
    unconditional passes as separate batches, the classic pipeline and ours as one batch of two)."""
    theirs = peer(generator=_generator(), output="latents", **inputs)
    assert torch.equal(pipe(generator=_generator(), output="latents", guidance_scale=1.0, **inputs), theirs)
    theirs = peer(generator=_generator(), output="latents", negative_prompt="blurry", **inputs)
    ours = pipe(generator=_generator(), output="latents", negative_prompt="blurry", **inputs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def _check_qwen_image(pipe, peer, inputs):
    """Qwen-Image: with a negative prompt (true CFG on in both) the peer's images equal ours bit for bit (as
    tensors: the peer's decode step takes no output_type "latent")."""
    inputs = {**inputs, "output_type": "pt"}
    theirs = peer(generator=_generator(), output="images", **inputs)
    ours = pipe(generator=_generator(), output="images", **inputs)
    assert torch.equal(ours, theirs)


def _check_wan(pipe, peer, inputs):
    """Wan 2.2: the peer with both guiders at the classic scale (5.0; its own defaults are 4.0 and 3.0) equals ours
    bit for bit. Both run the conditional and unconditional passes one after the other, as the classic pipeline."""
    peer.update_components(
        guider=ClassifierFreeGuidance(guidance_scale=5.0), guider_2=ClassifierFreeGuidance(guidance_scale=5.0)
    )
    # The peer's Wan decoder takes no output_type 'latent': it decodes, and its latents are asked for.
    peer_inputs = {name: value for name, value in inputs.items() if name != "output_type"}
    theirs = peer(generator=_generator(), output="latents", **peer_inputs)
    ours = pipe(generator=_generator(), output="videos", **inputs)
    assert torch.equal(ours, theirs)


@attrs.frozen
class Case:
    family: modular.BlockFamily
    classic_from: Callable[[Any, str], Any]
    inputs: dict[str, Any]  # text-to-image inputs that suit the tiny repo
    check_peer: Callable[[Any, Any, dict[str, Any]], None]  # the peer's output against ours
    make_repo: Callable[..., Path] | None = None  # the tiny repo, when not the family's default one
    workflow: str = "text2image"  # the classic pipeline's workflow the inputs are for
    output: str = "images"  # our output's name, and the classic output's attribute
    classic_output: str = "images"


CASES = {
    "sdxl": Case(blocks.stable_diffusion_xl.FAMILY, sdxl_classic, {"height": 64, "width": 64}, _check_sdxl),
    "flux": Case(blocks.flux.FAMILY, flux_classic, {"height": 32, "width": 32}, _check_flux),
    "z_image": Case(blocks.z_image.FAMILY, zimage_classic, {"height": 32, "width": 32}, _check_z_image),
    "flux2": Case(blocks.flux2.FAMILY, flux2_classic, {"height": 32, "width": 32}, _check_flux2),
    "flux2_klein": Case(
        blocks.flux2.FAMILY,
        klein_classic,
        {"height": 32, "width": 32},
        _check_flux2_klein,
        blocks.flux2.make_tiny_klein_repo,
    ),
    "sd3": Case(blocks.sd3.FAMILY, sd3_classic, {}, _check_sd3),
    "qwenimage": Case(
        blocks.qwenimage.FAMILY,
        qwenimage_classic,
        {"height": 32, "width": 32, "negative_prompt": "blurry"},
        _check_qwen_image,
    ),
    "wan": Case(
        blocks.wan.FAMILY,
        wan_classic,
        {"height": 32, "width": 32, "num_frames": 5},
        _check_wan,
        workflow="text2video",
        output="videos",
        classic_output="frames",
    ),
}
for _case in CASES.values():
    modular.register_family(_case.family)


def _inputs(case: Case) -> dict[str, Any]:
    return {"prompt": "a cat", "num_inference_steps": 2, "output_type": "latent", **case.inputs}


def _type_entry(cls: type | None) -> list[str | None]:
    """``[library, class]`` as an index writes it."""
    return [None, None] if cls is None else [cls.__module__.split(".")[0], cls.__name__]


def _component_entries(index: dict[str, Any]) -> dict[str, list]:
    return {k: v for k, v in index.items() if not k.startswith("_") and isinstance(v, list)}


@pytest.fixture(scope="module", params=list(CASES))
def case_and_repo(request, tmp_path_factory):
    case = CASES[request.param]
    make_repo = case.make_repo or case.family.make_tiny_repo
    return case, make_repo(tmp_path_factory.mktemp(request.param) / "tiny")


@pytest.fixture(scope="module")
def peer_saved(case_and_repo, tmp_path_factory):
    """The folder the peer's pipeline on the tiny repo saves to."""
    _, repo = case_and_repo
    peer = PeerPipeline.from_pretrained(str(repo))
    peer.load_components(torch_dtype=torch.float32)
    folder = tmp_path_factory.mktemp("peer-saved")
    peer.save_pretrained(str(folder), overwrite_modular_index=True)
    return type(peer).__name__, folder


@pytest.fixture(scope="module")
def ours_saved(case_and_repo, tmp_path_factory):
    """Our pipeline on the tiny repo (loaded), and the folder it saves to."""
    _, repo = case_and_repo
    pipe = modular.ModularPipeline.from_pretrained(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    folder = tmp_path_factory.mktemp("ours-saved") / "saved"
    pipe.save_pretrained(folder)
    return pipe, folder


# ----- peer -> ours -----


def test_ours_reads_the_peers_index_with_our_family_blocks(case_and_repo, peer_saved):
    """The peer's saved index selects our family's blocks class of the same name."""
    case, _ = case_and_repo
    _, folder = peer_saved
    pipe = modular.ModularPipeline.from_pretrained(folder)
    assert type(pipe.blocks) in case.family.all_blocks_classes
    assert type(pipe.blocks).__name__ == saved_index(folder)["_blocks_class_name"]


def test_our_specs_and_config_equal_the_peers_index(peer_saved):
    """Every spec of ours equals its index entry (repo, subfolder, variant, revision, type); configs too."""
    _, folder = peer_saved
    index = saved_index(folder)
    pipe = modular.ModularPipeline.from_pretrained(folder)
    entries = _component_entries(index)
    for name in pipe.pretrained_component_names:
        spec, fields = pipe.get_component_spec(name), entries[name][2]
        assert {k: getattr(spec, k) for k in LOAD_ID_FIELDS} == {k: fields[k] for k in LOAD_ID_FIELDS}, name
        assert _type_entry(spec.type_hint) == fields["type_hint"], name
    # Entries we have no component for are only ones the peer itself did not load (e.g. SDXL's controlnet).
    for name, entry in entries.items():
        if name not in pipe.component_names:
            assert entry[0:2] == [None, None], name
    configs = {k: v for k, v in index.items() if not k.startswith("_") and k not in entries}
    assert configs == {k: pipe.config[k] for k in configs}


def test_components_from_the_peers_index_load_and_equal_the_classic_pipeline(case_and_repo, peer_saved):
    """Ours loads every component the peer saved and its output equals the classic pipeline's bit for bit."""
    case, _ = case_and_repo
    _, folder = peer_saved
    entries = _component_entries(saved_index(folder))
    pipe = modular.ModularPipeline.from_pretrained(folder)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.null_component_names == []
    for name in pipe.pretrained_component_names:
        assert _type_entry(type(pipe.components[name])) == entries[name][0:2], name
    ours = pipe(generator=_generator(), output=case.output, **_inputs(case))
    classic = case.classic_from(pipe, case.workflow)(generator=_generator(), **_inputs(case))
    theirs = getattr(classic, case.classic_output)
    assert torch.equal(ours, theirs)


# ----- ours -> peer -----


def test_our_index_names_the_peers_pipeline_and_blocks_classes(peer_saved, ours_saved):
    """Our index's _class_name and _blocks_class_name are what the peer writes for the same repo."""
    peer_class_name, peer_folder = peer_saved
    _, folder = ours_saved
    ours, peers = saved_index(folder), saved_index(peer_folder)
    assert ours["_class_name"] == peers["_class_name"] == peer_class_name
    assert ours["_blocks_class_name"] == peers["_blocks_class_name"]


def test_the_peer_reads_our_index_and_loads_every_component(ours_saved):
    """The peer builds its family pipeline from our index; its specs equal our entries and all load."""
    _, folder = ours_saved
    index = saved_index(folder)
    peer = PeerPipeline.from_pretrained(str(folder))
    assert type(peer).__name__ == index["_class_name"]
    assert type(peer.blocks).__name__ == index["_blocks_class_name"]
    entries = _component_entries(index)
    for name, (_, _, fields) in entries.items():
        spec = peer.get_component_spec(name)
        # A saved component's entry has no repo, only its subfolder: "the folder this index is read from".
        assert fields["pretrained_model_name_or_path"] is None, name
        expected = {k: fields[k] for k in LOAD_ID_FIELDS} | {"pretrained_model_name_or_path": str(folder)}
        assert {k: getattr(spec, k) for k in LOAD_ID_FIELDS} == expected, name
        assert _type_entry(spec.type_hint) == fields["type_hint"], name
    peer.load_components(names=list(entries), torch_dtype=torch.float32)
    for name, entry in entries.items():
        assert _type_entry(type(getattr(peer, name))) == entry[0:2], name


def test_the_peer_on_our_saved_repo_runs_as_ours_does(case_and_repo, ours_saved):
    """The peer, loaded from our saved repo, gives ours's latents (how exactly: see each family's check)."""
    case, _ = case_and_repo
    pipe, folder = ours_saved
    peer = PeerPipeline.from_pretrained(str(folder))
    peer.load_components(torch_dtype=torch.float32)
    peer.set_progress_bar_config(disable=True)
    case.check_peer(pipe, peer, _inputs(case))


def test_the_peer_loads_our_saved_folder_after_it_is_moved(case_and_repo, ours_saved, tmp_path):
    """A folder we saved, moved elsewhere (the original gone), loads its own weights in the peer and runs."""
    case, _ = case_and_repo
    pipe, _ = ours_saved
    pipe.save_pretrained(tmp_path / "first")
    moved = Path(shutil.move(tmp_path / "first", tmp_path / "elsewhere" / "moved"))
    assert not (tmp_path / "first").exists()
    peer = PeerPipeline.from_pretrained(str(moved))
    peer.load_components(torch_dtype=torch.float32)
    peer.set_progress_bar_config(disable=True)
    for name in _component_entries(saved_index(moved)):
        assert peer.get_component_spec(name).pretrained_model_name_or_path == str(moved), name
    case.check_peer(pipe, peer, _inputs(case))
