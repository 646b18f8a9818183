"""ComponentsManager.components_for: a classic diffusers pipeline built on the manager's components."""

import inspect

import pytest
import torch
from diffusers import FluxControlPipeline, FluxPipeline, StableDiffusionPipeline

from blocks.flux import make_tiny_repo as make_tiny_flux_repo
from components import ComponentNotFoundError
from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes

FLUX_NAMES = ["scheduler", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer"]


@pytest.fixture(scope="module")
def flux_repos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flux")
    return make_tiny_flux_repo(folder / "base"), make_tiny_flux_repo(folder / "control", control=True)


def _loaded(repo, cm, collection):
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm, collection=collection)
    pipe.load_components(torch_dtype=torch.float32)
    return pipe


def _run(classic):
    classic.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)
    return classic(
        prompt="a cat", height=32, width=32, num_inference_steps=2, generator=generator, output_type="np"
    ).images


def test_components_for_gives_a_classic_pipeline_its_components(flux_repos):
    """FluxPipeline(**cm.components_for(FluxPipeline)) gets every component by name; optional ones are None."""
    cm = ComponentsManager()
    pipe = _loaded(flux_repos[0], cm, "base")
    kwargs = cm.components_for(FluxPipeline)
    assert list(kwargs) == [*FLUX_NAMES, "image_encoder", "feature_extractor"]
    assert all(kwargs[name] is getattr(pipe, name) for name in FLUX_NAMES)
    assert kwargs["image_encoder"] is None and kwargs["feature_extractor"] is None
    classic = FluxPipeline(**kwargs)
    assert classic.transformer is pipe.transformer


def test_a_classic_pipeline_runs_under_auto_offload_with_equal_outputs(flux_repos):
    """The classic pipeline on the manager's components, with evictions forced, equals its run without offload
    and copies nothing back."""
    cm = ComponentsManager()
    pipe = _loaded(flux_repos[0], cm, "base")
    classic = FluxPipeline(**cm.components_for(FluxPipeline))
    expected = _run(classic)
    budget = module_nbytes(pipe.transformer) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    assert torch.equal(torch.from_numpy(_run(classic)), torch.from_numpy(expected))
    assert cm.offload_log.total_evictions > 0
    assert cm.offload_log.total_bytes_to_host == 0


def test_several_components_of_one_name_need_a_collection(flux_repos):
    """Two repos' components of one name: without collection= it is a ValueError; with it, the collection's."""
    cm = ComponentsManager()
    _loaded(flux_repos[0], cm, "base")
    control = _loaded(flux_repos[1], cm, "control")
    with pytest.raises(
        ValueError,
        match=r"FluxControlPipeline: the manager holds 2 components named 'scheduler' \(\['scheduler_",
    ):
        cm.components_for(FluxControlPipeline)
    kwargs = cm.components_for(FluxControlPipeline, collection="control")
    assert list(kwargs) == FLUX_NAMES
    assert kwargs["transformer"] is control.transformer


def test_a_missing_required_component_names_what_is_held(flux_repos):
    """A required component the scope does not hold is a ComponentNotFoundError listing what it holds."""
    cm = ComponentsManager()
    pipe = _loaded(flux_repos[0], cm, "base")  # kept: its image processor stays registered while it lives
    cm.remove(cm.get_ids("vae")[0])
    with pytest.raises(ComponentNotFoundError) as info:
        cm.components_for(FluxPipeline)
    assert pipe.vae is not None
    assert str(info.value).startswith(
        "FluxPipeline needs ['vae'], which the manager does not hold (it holds ['image_processor', 'scheduler', "
        "'text_encoder', 'text_encoder_2', 'tokenizer', 'tokenizer_2', 'transformer'])"
    )


def test_optional_components_without_defaults_are_none():
    """A parameter the class lists in _optional_components (SD's safety checker) is None when not held."""
    cm = ComponentsManager()
    with pytest.raises(
        ComponentNotFoundError, match=r"StableDiffusionPipeline needs \['vae', 'text_encoder'"
    ):
        cm.components_for(StableDiffusionPipeline)
    required = [
        name
        for name, param in inspect.signature(StableDiffusionPipeline.__init__).parameters.items()
        if name != "self" and param.default is param.empty
    ]
    assert "safety_checker" in required and "feature_extractor" in required
    message = str(pytest.raises(ComponentNotFoundError, cm.components_for, StableDiffusionPipeline).value)
    assert "safety_checker" not in message and "feature_extractor" not in message


def test_components_for_takes_a_class():
    """Passing something other than a class is a TypeError that shows it."""
    with pytest.raises(
        TypeError, match=r"components_for\(\) takes a pipeline class such as FluxPipeline \(got 'flux'\)"
    ):
        ComponentsManager().components_for("flux")
