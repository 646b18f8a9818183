"""ComponentsManager: registry, collections, look-ups, search and model info."""

import gc

import pytest
import torch
from diffusers import PNDMScheduler

from components import ComponentNotFoundError, ComponentsManager, tag_load_id
from offload.devices.units import format_bytes


def module(seed=0, tied=False):
    torch.manual_seed(seed)
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    if tied:
        layer[1].weight = layer[0].weight
    return layer


@pytest.fixture
def cm():
    return ComponentsManager()


def test_add_returns_name_and_object_id(cm):
    """add() returns 'name_<id(obj)>', and the same object again returns the same id."""
    unet = module()
    component_id = cm.add("unet", unet)
    assert component_id == f"unet_{id(unet)}"
    assert cm.add("unet", unet) == component_id
    assert len(cm) == 1
    assert cm.get_id(unet) == component_id
    assert cm.get_id(module()) is None


def test_add_same_object_under_another_name_is_an_error(cm):
    """An object has one name in a manager."""
    unet = module()
    component_id = cm.add("unet", unet)
    with pytest.raises(ValueError, match=f"the same object is registered as '{component_id}'"):
        cm.add("transformer", unet)


def test_add_rejects_bad_name(cm):
    """A name must be an identifier."""
    with pytest.raises(
        ValueError, match="Component name must be a Python identifier such as 'unet' \\(got 'my unet'\\)"
    ):
        cm.add("my unet", module())


def test_collection_holds_one_component_per_name(cm):
    """A second 'unet' in a collection replaces the first, which leaves the manager when no collection holds it."""
    first, second = module(0), module(1)
    first_id = cm.add("unet", first, collection="sd")
    second_id = cm.add("unet", second, collection="sd")
    assert cm.collections == {"sd": [second_id]}
    assert first_id not in cm


def test_replaced_component_kept_when_another_collection_holds_it(cm):
    """The replaced component stays registered while it is still in another collection."""
    first, second = module(0), module(1)
    first_id = cm.add("unet", first, collection="sd")
    cm.add("unet", first, collection="xl")
    second_id = cm.add("unet", second, collection="sd")
    assert first_id in cm
    assert cm.collections == {"sd": [second_id], "xl": [first_id]}


def test_remove(cm):
    """remove() unregisters the component and takes it out of its collections."""
    component_id = cm.add("unet", module(), collection="sd")
    cm.remove(component_id)
    assert component_id not in cm
    assert cm.collections == {}


def test_remove_unknown_id_lists_what_exists(cm):
    """remove() of an unknown id is a ComponentNotFoundError (a KeyError) listing the registered ids."""
    vae_id = cm.add("vae", module())
    with pytest.raises(ComponentNotFoundError) as info:
        cm.remove("unet_1")
    assert (
        str(info.value)
        == f"Cannot remove 'unet_1': no component has this id. Registered components: ['{vae_id}']."
    )
    assert isinstance(info.value, KeyError)


def test_remove_from_collection(cm):
    """remove_from_collection keeps the component while another collection holds it, else removes it."""
    unet = module()
    component_id = cm.add("unet", unet, collection="a")
    cm.add("unet", unet, collection="b")
    cm.remove_from_collection(component_id, "a")
    assert component_id in cm and cm.collections == {"b": [component_id]}
    cm.remove_from_collection(component_id, "b")
    assert component_id not in cm


def test_remove_from_unknown_collection(cm):
    """remove_from_collection names the collection and what it holds."""
    component_id = cm.add("unet", module(), collection="a")
    with pytest.raises(ComponentNotFoundError, match=f"Collection 'b' does not hold '{component_id}'"):
        cm.remove_from_collection(component_id, "b")


class Owner:
    """Stands in for a pipeline: something that holds components and supports weak references."""


def test_registration_with_owner_is_dropped_when_the_owner_is_collected(cm):
    """add(..., owner=o) registers the component until o is garbage-collected."""
    owner = Owner()
    component_id = cm.add("scheduler", PNDMScheduler(), collection="sd", owner=owner)
    assert component_id in cm and cm.collections == {"sd": [component_id]}
    del owner
    gc.collect()
    assert component_id not in cm
    assert len(cm) == 0 and cm.collections == {}


def test_registration_lasts_while_any_owner_lives(cm):
    """A second owner keeps the registration until both owners are gone."""
    first, second = Owner(), Owner()
    component = PNDMScheduler()
    component_id = cm.add("scheduler", component, owner=first)
    assert cm.add("scheduler", component, owner=second) == component_id
    del first
    gc.collect()
    assert component_id in cm
    del second
    gc.collect()
    assert component_id not in cm


def test_adding_without_owner_keeps_the_registration(cm):
    """add() without owner makes an owned registration permanent; an owner given later changes nothing."""
    first, second = Owner(), Owner()
    component = PNDMScheduler()
    component_id = cm.add("scheduler", component, owner=first)
    cm.add("scheduler", component)
    cm.add("scheduler", component, owner=second)
    del first, second
    gc.collect()
    assert cm.get_one(component_id=component_id) is component


def test_owned_registration_removed_by_hand_stays_removed(cm):
    """A late owner finalizer leaves a new registration of the same object alone."""
    owner = Owner()
    component = PNDMScheduler()
    component_id = cm.add("scheduler", component, owner=owner)
    cm.remove(component_id)
    assert cm.add("scheduler", component) == component_id
    del owner
    gc.collect()
    assert component_id in cm


def test_owner_finalizer_only_queues(cm):
    """A collected owner changes the registry at the manager's next call, never from the garbage collector."""
    owner = Owner()
    component_id = cm.add("scheduler", PNDMScheduler(), owner=owner)
    del owner
    gc.collect()
    assert component_id in cm._registry.entries  # the collector may run while the registry is being iterated
    assert component_id not in cm


def test_owner_must_support_weak_references(cm):
    """An owner that cannot be weakly referenced is a TypeError that says why; nothing is registered."""
    with pytest.raises(TypeError) as info:
        cm.add("scheduler", PNDMScheduler(), owner=3)
    assert str(info.value) == (
        "Cannot add 'scheduler' with owner=int: an owner must support weak references "
        "(the registration is dropped when the owner is garbage-collected)."
    )
    assert len(cm) == 0


def test_get_one(cm):
    """get_one finds one component by id, name, collection or load_id."""
    unet, vae = module(0), module(1)
    tag_load_id(vae, "org/sd|vae|null|null")
    unet_id = cm.add("unet", unet, collection="sd")
    cm.add("vae", vae)
    assert cm.get_one(unet_id) is unet
    assert cm.get_one(name="unet") is unet
    assert cm.get_one(name="v*") is vae
    assert cm.get_one(collection="sd") is unet
    assert cm.get_one(load_id="org/sd|vae|null|null") is vae


def test_get_one_errors(cm):
    """get_one: nothing matching lists what exists; several matching lists them; id plus filters is refused."""
    unet_id = cm.add("unet", module(0), collection="a")
    other_id = cm.add("unet", module(1), collection="b")
    with pytest.raises(ComponentNotFoundError) as info:
        cm.get_one(name="vae")
    assert str(info.value) == (
        f"No component matches name 'vae', collection None, load_id None. Registered components: ['{unet_id}', '{other_id}']."
    )
    with pytest.raises(
        ValueError, match=f"2 components match name 'unet'.*\\['{unet_id}', '{other_id}'\\]. Narrow it"
    ):
        cm.get_one(name="unet")
    with pytest.raises(ComponentNotFoundError, match="No component has id 'nope'"):
        cm.get_one("nope")
    with pytest.raises(ValueError, match="pass either component_id or name"):
        cm.get_one(unet_id, name="unet")


def test_get_ids_and_components(cm):
    """get_ids filters by exact names and collection; get_components_by_ids/by_names return dicts by name."""
    unet, vae, scheduler = module(0), module(1), PNDMScheduler()
    unet_id = cm.add("unet", unet, collection="sd")
    vae_id = cm.add("vae", vae, collection="sd")
    cm.add("scheduler", scheduler)
    assert cm.get_ids("unet") == [unet_id]
    assert cm.get_ids(["unet", "vae"], collection="sd") == [unet_id, vae_id]
    assert cm.get_ids(collection="sd") == [unet_id, vae_id]
    assert cm.get_components_by_ids([unet_id, vae_id]) == {"unet": unet, "vae": vae}
    assert cm.get_components_by_ids([vae_id], return_dict_with_names=False) == {vae_id: vae}
    assert cm.get_components_by_names(["unet", "scheduler", "text_encoder"]) == {
        "unet": unet,
        "scheduler": scheduler,
    }
    with pytest.raises(ComponentNotFoundError, match="Unknown component id\\(s\\) \\['x_1'\\]"):
        cm.get_components_by_ids(["x_1"])


def test_get_components_by_names_with_duplicates(cm):
    """Two components of one name: by name needs a collection to choose."""
    a, b = module(0), module(1)
    cm.add("unet", a, collection="a")
    cm.add("unet", b, collection="b")
    with pytest.raises(
        ValueError, match="Several components are named 'unet'.*pass collection=... to choose"
    ):
        cm.get_components_by_names(["unet"])
    assert cm.get_components_by_names(["unet"], collection="b") == {"unet": b}


def test_search_components(cm):
    """search_components selects by pattern, collection and load_id."""
    objects = {name: module(i) for i, name in enumerate(["unet", "vae", "text_encoder", "text_encoder_2"])}
    for name, obj in objects.items():
        cm.add(name, obj, collection="xl" if name.endswith("_2") else None)
    assert list(cm.search_components("text*")) == ["text_encoder", "text_encoder_2"]
    assert list(cm.search_components("unet|vae")) == ["unet", "vae"]
    assert list(cm.search_components("!*enc*")) == ["unet", "vae"]
    assert list(cm.search_components(collection="xl")) == ["text_encoder_2"]
    assert list(cm.search_components()) == list(objects)
    by_id = cm.search_components("vae", return_dict_with_names=False)
    assert by_id == {cm.get_id(objects["vae"]): objects["vae"]}


def test_search_matching_nothing_is_an_error(cm):
    """A pattern that matches nothing raises, naming the pattern and listing the registered ids."""
    unet_id = cm.add("unet", module())
    with pytest.raises(ComponentNotFoundError) as info:
        cm.search_components("transformer*")
    assert str(info.value) == (
        f"No component matches pattern 'transformer*' (collection None, load_id None). Registered components: ['{unet_id}']."
    )


def test_model_info_of_a_module(cm):
    """get_model_info reports class, size from unique storages, device, dtype, load ID, no hook."""
    unet = module(tied=True).to(torch.float16)
    tag_load_id(unet, "org/sd|unet|null|null")
    component_id = cm.add("unet", unet, collection="sd")
    info = cm.get_model_info(component_id)
    # Tied weight counted once: one 4x4 weight and two biases of 4, in float16.
    assert info["size_gb"] * 1024**3 == (16 + 4 + 4) * 2
    assert {k: info[k] for k in ("model_id", "collection", "class_name", "device", "dtype", "load_id")} == {
        "model_id": component_id,
        "collection": "sd",
        "class_name": "Sequential",
        "device": "cpu",
        "dtype": "torch.float16",
        "load_id": "org/sd|unet|null|null",
    }
    assert (
        info["adapters"],
        info["has_hook"],
        info["execution_device"],
        info["ip_adapter"],
        info["quantization"],
    ) == (
        None,
        False,
        None,
        None,
        None,
    )
    assert isinstance(info["added_time"], float)


def test_model_info_counts_shared_storage_once(cm):
    """A buffer that views a parameter's storage adds no bytes."""
    layer = torch.nn.Linear(8, 8, bias=False)
    layer.register_buffer("view", layer.weight.data[:2])
    component_id = cm.add("layer", layer)
    assert cm.get_model_info(component_id, "size_gb") == {"size_gb": 64 * 4 / 1024**3}


def test_model_info_fields(cm):
    """fields= selects; an unknown field is a ValueError listing the available ones."""
    component_id = cm.add("scheduler", PNDMScheduler())
    assert cm.get_model_info(component_id, ["class_name", "size_gb"]) == {
        "class_name": "PNDMScheduler",
        "size_gb": None,
    }
    with pytest.raises(ValueError, match="unknown field\\(s\\) \\['speed'\\]; available: \\['model_id'"):
        cm.get_model_info(component_id, "speed")
    with pytest.raises(ComponentNotFoundError):
        cm.get_model_info("nope")


def test_model_info_reads_peft_adapters(cm):
    """LoRA adapters injected with peft show in adapters."""
    from peft import LoraConfig, inject_adapter_in_model

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model = inject_adapter_in_model(LoraConfig(r=2, target_modules=["0"]), model, adapter_name="style")
    model.peft_config = {"style": LoraConfig(r=2, target_modules=["0"])}
    component_id = cm.add("unet", model)
    assert cm.get_model_info(component_id, "adapters") == {"adapters": ["style"]}
    assert f"{component_id}:\n  Adapters: ['style']" in cm.table()


def test_model_info_reads_quantization_config(cm):
    """A model quantized at load time reports its backend and weights, read from its quantization config."""

    class Config:
        def to_dict(self):
            return {"quant_method": "bitsandbytes", "load_in_4bit": True}

    class Quantizer:
        quantization_config = Config()

    model = module()
    model.hf_quantizer = Quantizer()
    component_id = cm.add("transformer", model)
    assert cm.get_model_info(component_id, "quantization") == {
        "quantization": {"method": "bitsandbytes", "weights": "4-bit", "skipped_modules": None}
    }
    size = format_bytes(cm.get_model_info(component_id)["size_gb"] * 1024**3)
    assert f"  Quantization: bitsandbytes (4-bit), packed {size}" in cm.table()


def test_none_is_refused_as_none_not_confused_with_another_entry():
    """`cm.add("feature_extractor", None)` after another None: a TypeError about None, and nothing registered
    (before, the second None was "the same object registered as 'image_encoder_...'")."""
    cm = ComponentsManager()
    for name in ("image_encoder", "feature_extractor"):
        with pytest.raises(TypeError, match=rf"add\('{name}', None\): None is not a component; leave it out"):
            cm.add(name, None)
    assert len(cm) == 0
