"""get_or_load: reuse by load ID and load options, failed loads, threads, memory release."""

import gc
import threading
import time
import weakref

import pytest
import torch
from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
from transformers import CLIPTokenizer

from components import ComponentsManager, ComponentSpec, SubfolderNotFoundError, get_load_id


@pytest.fixture
def count_loads(monkeypatch):
    """Counts from_pretrained calls per class name (the real loads still run)."""
    calls = []

    def wrap(cls, delay=0.0):
        original = cls.from_pretrained.__func__

        def counting(klass, *args, **kwargs):
            calls.append(klass.__name__)
            time.sleep(delay)
            return original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(counting))

    wrap.calls = calls
    return wrap


def spec(repo, name, cls=None, **kwargs):
    return ComponentSpec(name, cls, repo=str(repo), subfolder=name, **kwargs)


def test_same_load_id_and_options_is_reused(tiny_repo, count_loads):
    """A second get_or_load with the same load ID and dtype returns the registered object without loading."""
    count_loads(AutoencoderKL)
    cm = ComponentsManager()
    first = cm.get_or_load(spec(tiny_repo, "vae", AutoencoderKL), torch_dtype=torch.float32)
    second = cm.get_or_load(spec(tiny_repo, "vae"), dtype="float32")
    assert second is first
    assert count_loads.calls == ["AutoencoderKL"]
    assert len(cm) == 1


def test_different_dtype_variant_or_revision_loads_apart(tiny_repo, count_loads):
    """Another dtype or variant is a different component: loaded and registered apart."""
    count_loads(UNet2DConditionModel)
    cm = ComponentsManager()
    base = cm.get_or_load(spec(tiny_repo, "unet", UNet2DConditionModel))
    half = cm.get_or_load(spec(tiny_repo, "unet", UNet2DConditionModel), torch_dtype=torch.float16)
    variant = cm.get_or_load(
        spec(tiny_repo, "unet", UNet2DConditionModel), variant="fp16", torch_dtype=torch.float16
    )
    assert len({id(base), id(half), id(variant)}) == 3
    assert count_loads.calls == ["UNet2DConditionModel"] * 3
    assert get_load_id(variant) == f"{tiny_repo}|unet|fp16|null"
    assert cm.get_or_load(spec(tiny_repo, "unet", variant="fp16"), torch_dtype=torch.float16) is variant


def test_added_object_is_reused_when_dtype_matches(tiny_repo, count_loads):
    """An object added by hand is reused for a request whose dtype it already has."""
    count_loads(AutoencoderKL)
    vae = spec(tiny_repo, "vae", AutoencoderKL).load(torch_dtype=torch.float16)
    cm = ComponentsManager()
    cm.add("vae", vae)
    assert cm.get_or_load(spec(tiny_repo, "vae"), torch_dtype=torch.float16) is vae
    assert cm.get_or_load(spec(tiny_repo, "vae"), torch_dtype=torch.bfloat16) is not vae
    assert count_loads.calls == ["AutoencoderKL", "AutoencoderKL"]


def test_dtype_does_not_split_objects_without_weights(tiny_repo, count_loads):
    """A tokenizer loaded once serves requests with any dtype."""
    count_loads(CLIPTokenizer)
    cm = ComponentsManager()
    first = cm.get_or_load(spec(tiny_repo, "tokenizer"))
    assert cm.get_or_load(spec(tiny_repo, "tokenizer"), torch_dtype=torch.float16) is first
    assert count_loads.calls == ["CLIPTokenizer"]


def test_reuse_adds_to_the_collection(tiny_repo):
    """A reused component joins the collection asked for."""
    cm = ComponentsManager()
    vae = cm.get_or_load(spec(tiny_repo, "vae"), collection="t2i")
    assert cm.get_or_load(spec(tiny_repo, "vae"), collection="i2i") is vae
    assert cm.collections == {"t2i": [cm.get_id(vae)], "i2i": [cm.get_id(vae)]}


def test_hub_load_ids_in_the_table(hub_cache):
    """Components loaded by hub id show load IDs like org/name|unet|fp16|<revision>."""
    cm = ComponentsManager()
    cm.get_or_load(
        ComponentSpec("unet", repo=hub_cache.repo_id, subfolder="unet", variant="fp16", revision="main")
    )
    cm.get_or_load(
        ComponentSpec("vae", repo=hub_cache.repo_id, subfolder="vae", revision=hub_cache.v2_commit)
    )
    table = cm.table()
    assert "| org/tiny-sd|unet|fp16|main " in table
    assert f"| org/tiny-sd|vae|null|{hub_cache.v2_commit} " in table


def test_from_config_spec_is_created():
    """A from_config spec is built with create() and registered."""
    cm = ComponentsManager()
    scheduler = cm.get_or_load(
        ComponentSpec("scheduler", PNDMScheduler, default_creation_method="from_config")
    )
    assert isinstance(scheduler, PNDMScheduler)
    assert cm.get_one(name="scheduler") is scheduler


def test_failed_load_registers_nothing(tiny_repo):
    """A load that fails leaves the manager as it was."""
    cm = ComponentsManager()
    vae_id = cm.add("vae", torch.nn.Linear(1, 1), collection="sd")
    with pytest.raises(SubfolderNotFoundError):
        cm.get_or_load(ComponentSpec("unet", repo=str(tiny_repo), subfolder="transformer"), collection="sd")
    assert list(cm.components) == [vae_id]
    assert cm.collections == {"sd": [vae_id]}
    assert cm._loads._loading == {}


def test_two_threads_load_the_same_component_once(tiny_repo, count_loads):
    """Two threads asking for one component concurrently get one object, loaded once."""
    count_loads(AutoencoderKL, delay=0.2)
    cm = ComponentsManager()
    results, errors = [], []
    barrier = threading.Barrier(2)

    def work():
        try:
            barrier.wait()
            results.append(cm.get_or_load(spec(tiny_repo, "vae", AutoencoderKL), collection="sd"))
        except Exception as error:  # collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results[0] is results[1]
    assert count_loads.calls == ["AutoencoderKL"]
    assert len(cm) == 1


def test_threads_registering_and_loading_corrupt_nothing(tiny_repo):
    """Threads loading different components while others add and remove leave a consistent registry."""
    cm = ComponentsManager()
    errors = []

    def churn(tag):
        try:
            for i in range(50):
                component_id = cm.add(f"layer_{tag}", torch.nn.Linear(1, 1), collection=f"c{i % 3}")
                assert cm.get_one(component_id) is not None
                if i % 2:
                    cm.remove(component_id)
        except Exception as error:
            errors.append(error)

    def load(name):
        try:
            cm.get_or_load(spec(tiny_repo, name), collection="sd")
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=churn, args=(t,)) for t in "ab"]
    threads += [threading.Thread(target=load, args=(name,)) for name in ("vae", "text_encoder", "tokenizer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    members = [cid for ids in cm.collections.values() for cid in ids]
    assert set(members) <= set(cm.components)
    assert sorted(cm.get_components_by_names(["vae", "text_encoder", "tokenizer"], collection="sd")) == [
        "text_encoder",
        "tokenizer",
        "vae",
    ]
    for collection, ids in cm.collections.items():
        names = [cid.rsplit("_", 1)[0] for cid in ids]
        assert len(names) == len(set(names)), collection


def test_loads_at_once_in_one_process_each_get_real_weights(tiny_repo):
    """Two managers loading in two threads at once (replicas of one process): no weight is left on the meta
    device (the libraries' empty-weights context patches torch process-wide, so loads take turns)."""
    left_empty = []

    def load(name):
        barrier.wait()
        component = ComponentsManager().get_or_load(spec(tiny_repo, name))
        left_empty.extend(f"{name}.{key}" for key, value in component.state_dict().items() if value.is_meta)

    for _ in range(3):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=load, args=(name,)) for name in ("text_encoder", "unet")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert left_empty == []


def test_remove_frees_the_object(tiny_repo):
    """After remove(), nothing in the manager keeps the object alive."""
    cm = ComponentsManager()
    unet = cm.get_or_load(spec(tiny_repo, "unet"), collection="sd")
    ref = weakref.ref(unet)
    component_id = cm.get_id(unet)
    cm.table(), cm.get_model_info(component_id)
    del unet
    gc.collect()
    assert ref() is not None
    cm.remove(component_id)
    gc.collect()
    assert ref() is None
