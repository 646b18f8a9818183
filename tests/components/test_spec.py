"""ComponentSpec and ConfigSpec: fields, validation, load IDs, create, from_component."""

import attrs
import pytest
import torch
from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel

from components import ComponentSpec, ConfigSpec, get_load_id


def test_name_and_type_hint_are_positional():
    """ComponentSpec("unet", UNet2DConditionModel) sets name and type_hint."""
    spec = ComponentSpec("unet", UNet2DConditionModel)
    assert (spec.name, spec.type_hint, spec.subfolder) == ("unet", UNet2DConditionModel, "")


def test_repo_is_an_alias():
    """repo= fills pretrained_model_name_or_path, and .repo reads it."""
    spec = ComponentSpec(name="vae", type_hint=AutoencoderKL, repo="org/name", subfolder="vae")
    assert spec.pretrained_model_name_or_path == "org/name"
    assert spec.repo == "org/name"
    assert spec == ComponentSpec(
        "vae", AutoencoderKL, pretrained_model_name_or_path="org/name", subfolder="vae"
    )


def test_repo_and_path_that_disagree_are_rejected():
    """Giving repo= and a different pretrained_model_name_or_path is a ValueError."""
    with pytest.raises(
        ValueError, match="repo \\('a/b'\\) and pretrained_model_name_or_path \\('c/d'\\) disagree"
    ):
        ComponentSpec("vae", repo="a/b", pretrained_model_name_or_path="c/d")


def test_load_id_examples():
    """load_id joins repo, subfolder, variant, revision; 'null' for from_config specs."""
    assert ComponentSpec("vae", repo="org/name", subfolder="vae").load_id == "org/name|vae|null|null"
    assert ComponentSpec(
        "unet", repo="org/name", subfolder="unet", variant="fp16", revision="v2"
    ).load_id == ("org/name|unet|fp16|v2")
    assert ComponentSpec("scheduler", PNDMScheduler, default_creation_method="from_config").load_id == "null"


def test_subfolder_none_becomes_empty():
    """subfolder=None is stored as '' (the repo root), as the peer writes it."""
    assert ComponentSpec("te", repo="org/clip", subfolder=None).load_id == "org/clip||null|null"


def test_decode_load_id_inverts_load_id():
    """ComponentSpec.decode_load_id(spec.load_id) gives the loading fields back."""
    spec = ComponentSpec("unet", repo="org/name", subfolder="unet", variant="fp16")
    assert ComponentSpec.decode_load_id(spec.load_id) == {
        "pretrained_model_name_or_path": "org/name",
        "subfolder": "unet",
        "variant": "fp16",
        "revision": None,
    }
    assert ComponentSpec(spec.name, **ComponentSpec.decode_load_id(spec.load_id)) == spec


def test_equality_is_name_load_id_and_method():
    """Specs differing only in type_hint or description are equal and hash alike; another variant is not."""
    a = ComponentSpec("unet", UNet2DConditionModel, description="x", repo="r", subfolder="unet")
    b = ComponentSpec("unet", None, description="y", repo="r", subfolder="unet")
    c = attrs.evolve(a, variant="fp16")
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2


def test_spec_is_frozen():
    """A spec cannot be changed in place; attrs.evolve makes a changed copy."""
    spec = ComponentSpec("unet", repo="r", subfolder="unet")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.variant = "fp16"
    assert attrs.evolve(spec, variant="fp16").load_id == "r|unet|fp16|null"
    assert spec.variant is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"name": "my unet"},
            ValueError,
            "ComponentSpec.name must be a Python identifier such as 'unet' (got 'my unet').",
        ),
        ({"name": "unet", "repo": "a|b"}, ValueError, "must not contain '|'"),
        ({"name": "unet", "variant": "null"}, ValueError, "must not be 'null'"),
        ({"name": "unet", "revision": 3}, TypeError, "ComponentSpec.revision must be a str or None (got 3"),
        ({"name": "unet", "type_hint": "UNet"}, TypeError, "ComponentSpec.type_hint must be a class or None"),
        ({"name": "unet", "default_creation_method": "magic"}, ValueError, "default_creation_method"),
    ],
)
def test_invalid_spec_cannot_be_built(kwargs, error, message):
    """Validators reject bad fields with a message naming the field and the value."""
    with pytest.raises(error) as info:
        ComponentSpec(**kwargs)
    assert message in str(info.value)


def test_create_builds_from_config_and_tags_null():
    """create() builds with from_config, merging the given config over the spec's, tagged 'null'."""
    spec = ComponentSpec(
        "scheduler",
        PNDMScheduler,
        config={"num_train_timesteps": 500, "beta_start": 0.001},
        default_creation_method="from_config",
    )
    scheduler = spec.create(config={"beta_start": 0.002})
    assert isinstance(scheduler, PNDMScheduler)
    assert scheduler.config.num_train_timesteps == 500
    assert scheduler.config.beta_start == 0.002
    assert get_load_id(scheduler) == "null"


def test_create_builds_plain_classes_with_constructor():
    """create() calls the constructor of a class without from_config."""

    class Processor:
        def __init__(self, scale=1):
            self.scale = scale

    processor = ComponentSpec(
        "processor", Processor, config={"scale": 2}, default_creation_method="from_config"
    ).create()
    assert processor.scale == 2
    assert get_load_id(processor) == "null"


def test_create_without_type_hint_is_an_error():
    """create() needs a type_hint."""
    with pytest.raises(ValueError, match="ComponentSpec 'scheduler' has no type_hint"):
        ComponentSpec("scheduler", default_creation_method="from_config").create()


def test_from_component_of_loaded_object_matches_its_spec(tiny_repo):
    """from_component on a loaded object gives a spec equal to the one that loaded it, with its class."""
    spec = ComponentSpec("vae", repo=str(tiny_repo), subfolder="vae", variant="fp16")
    vae = spec.load()
    described = ComponentSpec.from_component("vae", vae)
    assert described == spec
    assert described.type_hint is AutoencoderKL
    assert described.default_creation_method == "from_pretrained"


def test_from_component_of_config_object_is_from_config():
    """from_component on a scheduler gives a from_config spec carrying its config."""
    scheduler = PNDMScheduler(num_train_timesteps=321)
    spec = ComponentSpec.from_component("scheduler", scheduler)
    assert spec.default_creation_method == "from_config"
    assert spec.create().config.num_train_timesteps == 321


def test_from_component_of_untagged_module_is_an_error():
    """A module without a load ID cannot be described: ValueError saying how to fix it."""
    with pytest.raises(
        ValueError, match="Load it with ComponentSpec.load\\(\\), or tag it with components.tag_load_id"
    ):
        ComponentSpec.from_component("layer", torch.nn.Linear(2, 2))


def test_load_does_not_change_the_spec(tiny_repo):
    """load() with overrides returns an object tagged with the overridden load ID; the spec stays as it was."""
    spec = ComponentSpec("vae", AutoencoderKL, repo=str(tiny_repo), subfolder="vae")
    vae = spec.load(variant="fp16")
    assert get_load_id(vae) == f"{tiny_repo}|vae|fp16|null"
    assert spec.variant is None


def test_load_rejects_unknown_keyword():
    """An unknown keyword to load() is a TypeError naming the closest valid one."""
    spec = ComponentSpec("vae", AutoencoderKL, repo="org/name", subfolder="vae")
    with pytest.raises(
        TypeError, match="got unknown keyword\\(s\\) 'varaint' \\(did you mean 'variant'\\?\\)"
    ):
        spec.load(varaint="fp16")


def test_load_without_repo_is_an_error():
    """load() without any repo says where to set one."""
    with pytest.raises(ValueError, match="ComponentSpec 'vae' has no repo to load from"):
        ComponentSpec("vae", AutoencoderKL).load()


def test_load_rejects_conflicting_dtypes(tiny_repo):
    """dtype and torch_dtype that disagree are a ValueError."""
    spec = ComponentSpec("vae", AutoencoderKL, repo=str(tiny_repo), subfolder="vae")
    with pytest.raises(
        ValueError, match="dtype \\(torch.float16\\) and torch_dtype \\(torch.float32\\) disagree"
    ):
        spec.load(dtype=torch.float16, torch_dtype=torch.float32)


def test_config_spec_fields():
    """ConfigSpec holds name, default, description and is frozen."""
    config = ConfigSpec("requires_safety_checker", False, "Whether to run the safety checker.")
    assert (config.name, config.default, config.description) == (
        "requires_safety_checker",
        False,
        "Whether to run the safety checker.",
    )
    assert ConfigSpec("x", 1) == ConfigSpec("x", 1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.default = True


def test_the_repr_names_fields_as_the_constructor_takes_them():
    """A spec whose class is named by path shows `type_hint=` (the keyword), not its private field's name."""
    spec = ComponentSpec("unet", "diffusers.UNet2DConditionModel", subfolder="unet")
    assert repr(spec).startswith("ComponentSpec(name='unet', type_hint='diffusers.UNet2DConditionModel', ")
    assert "_type_hint" not in repr(spec)
