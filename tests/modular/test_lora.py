"""LoRA on ModularPipeline beyond parity: where files come from, shared components, the manager's record, auto
offload, and bad calls that change nothing."""

import pytest
import torch
from diffusers import StableDiffusionPipeline
from diffusers.loaders import StableDiffusionLoraLoaderMixin
from safetensors.torch import load_file

import modular.adapters.lora
from components import CorruptWeightsError, MissingComponentFileError, PickleWeightsError, RepoNotFoundError
from components.model_info import lora_layers
from modular import BlockFamily, ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes
from tests.blocks.lora_helpers import CLIP_TARGETS, DENOISER_TARGETS, make_lora, same
from tests.components.hub_cache import add_to_hub_cache

from .tiny_sd import tiny_sd_pipeline
from .toy_blocks import AddOneThenDouble


@pytest.fixture(scope="module")
def loras(repo, tmp_path_factory):
    """Two random LoRAs over the UNet and the text encoder; alpha equals the rank, so a copy without the file's
    metadata (a .bin) loads to the same weights."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    targets = {"unet": (pipe.unet, DENOISER_TARGETS), "text_encoder": (pipe.text_encoder, CLIP_TARGETS)}
    folder = tmp_path_factory.mktemp("loras")
    return [
        make_lora(folder / name, StableDiffusionPipeline, targets, seed=seed, alpha=4.0)
        for seed, name in enumerate("ab")
    ]


SIZE = {"height": 32, "width": 32}  # not the tiny repo's 64x64: a quarter of the work, the same LoRA effects


def images(pipe):
    return pipe(
        prompt="a cat",
        num_inference_steps=2,
        **SIZE,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
        output="images",
    )


def snapshot(pipe, cm=None):
    """What a failed call must leave as it was: every model's state dict (names and values), the adapters and
    the manager's table."""
    weights = {
        name: {key: value.clone() for key, value in model.state_dict().items()}
        for name, model in pipe.components.items()
        if isinstance(model, torch.nn.Module)
    }
    return weights, pipe.get_list_adapters(), str(cm) if cm is not None else None


def assert_unchanged(before, after):
    (weights, adapters, table), (weights_now, adapters_now, table_now) = before, after
    assert adapters_now == adapters and table_now == table
    for name, state in weights.items():
        assert list(weights_now[name]) == list(state), name
        assert all(torch.equal(weights_now[name][key], value) for key, value in state.items()), name


# ----- where a LoRA comes from -----


def test_a_file_a_folder_and_a_hub_repo_give_the_same_lora(repo, loras, tmp_path):
    """The file's path, its folder, and a hub repo id (through the cache, offline) load the same weights; a
    revision picks the other LoRA."""
    cache = tmp_path / "hub"
    add_to_hub_cache(cache, "org/lora", loras[0], ref="main")
    add_to_hub_cache(cache, "org/lora", loras[1], ref="v2")
    results = []
    for source, options in [
        (loras[0] / "pytorch_lora_weights.safetensors", {}),
        (loras[0], {}),
        ("org/lora", {"cache_dir": cache}),
        ("org/lora", {"cache_dir": cache, "revision": "v2"}),
    ]:
        pipe = tiny_sd_pipeline(repo, ComponentsManager())
        pipe.load_lora_weights(source, **options)
        results.append(images(pipe))
    assert same(results[0], results[1]) and same(results[0], results[2])
    assert not same(results[0], results[3])


def test_a_pickle_file_loads_only_with_use_pickle(repo, loras, tmp_path):
    """A .bin LoRA is refused without use_pickle=True, naming the fix; with it, it loads as the safetensors file."""
    torch.save(load_file(loras[0] / "pytorch_lora_weights.safetensors"), tmp_path / "lora.bin")
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    before = snapshot(pipe, cm)
    for source, weight_name in [(tmp_path / "lora.bin", None), (tmp_path, "lora.bin"), (tmp_path, None)]:
        with pytest.raises(PickleWeightsError, match=r"refused by default\. .*[Pp]ass use_pickle=True"):
            pipe.load_lora_weights(source, weight_name=weight_name)
        assert_unchanged(before, snapshot(pipe, cm))
    pipe.load_lora_weights(tmp_path / "lora.bin", use_pickle=True)
    reference = tiny_sd_pipeline(repo, ComponentsManager())
    reference.load_lora_weights(loras[0])
    assert same(images(pipe), images(reference))


@pytest.mark.parametrize(
    ("make_source", "error", "message"),
    [
        (lambda tmp, lora: (tmp / "nowhere", {}), RepoNotFoundError, "no such local folder"),
        (
            lambda tmp, lora: (lora, {"weight_name": "other.safetensors"}),
            MissingComponentFileError,
            "has no LoRA file 'other.safetensors' (files present: ",
        ),
        (lambda tmp, lora: (tmp, {}), MissingComponentFileError, "holds no LoRA file (*.safetensors)"),
        (lambda tmp, lora: (42, {}), TypeError, "takes a state dict, a .safetensors file, a folder or a hub"),
        (lambda tmp, lora: (lora, {"strength": 2}), TypeError, "unknown keyword(s) ['strength']"),
        (
            lambda tmp, lora: ({"unet.x.lora_A.weight": 1.0}, {}),
            TypeError,
            "to tensors (not so for ['unet.x.lora_A.weight'])",
        ),
    ],
    ids=["missing_folder", "missing_file", "empty_folder", "wrong_type", "unknown_keyword", "not_tensors"],
)
def test_a_missing_or_wrong_source_is_refused_and_changes_nothing(
    repo, loras, tmp_path, make_source, error, message
):
    """Each bad source is a clear error, raised before any model changes."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    before = snapshot(pipe, cm)
    source, options = make_source(tmp_path, loras[0])
    with pytest.raises(error) as info:
        pipe.load_lora_weights(source, **options)
    assert message in str(info.value)
    assert_unchanged(before, snapshot(pipe, cm))


def test_a_truncated_file_and_an_ambiguous_folder_are_refused(repo, loras, tmp_path):
    """A truncated safetensors file names the file; a folder with two LoRA files asks for weight_name."""
    data = (loras[0] / "pytorch_lora_weights.safetensors").read_bytes()
    (tmp_path / "one.safetensors").write_bytes(data[: len(data) // 2])
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    with pytest.raises(CorruptWeightsError, match="one.safetensors is truncated"):
        pipe.load_lora_weights(tmp_path)
    (tmp_path / "two.safetensors").write_bytes(data)
    with pytest.raises(
        ValueError, match=r"several LoRA files \(\['one.safetensors', 'two.safetensors'\]\); pass"
    ):
        pipe.load_lora_weights(tmp_path)
    pipe.load_lora_weights(tmp_path, weight_name="two.safetensors")
    assert pipe.get_list_adapters() == {"unet": ["default_0"], "text_encoder": ["default_0"]}


# ----- bad calls -----


def test_keys_that_match_no_component_are_refused(repo, loras):
    """A LoRA with keys for a model the pipeline lacks names the unmatched prefixes; nothing is loaded."""
    state_dict = load_file(loras[0] / "pytorch_lora_weights.safetensors")
    state_dict["transformer.blocks.0.to_q.lora_A.weight"] = torch.zeros(4, 8)
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    before = snapshot(pipe, cm)
    with pytest.raises(ValueError) as info:
        pipe.load_lora_weights(state_dict)
    assert str(info.value) == (
        "load_lora_weights: a state dict has keys starting with ['transformer'], which match no component of this "
        "pipeline; StableDiffusionLoraLoaderMixin loads into ['unet', 'text_encoder'] and this pipeline has "
        "['unet', 'text_encoder']. Pass a LoRA made for this model family (or a state dict without those keys)."
    )
    assert_unchanged(before, snapshot(pipe, cm))


def test_an_adapter_name_in_use_is_refused(repo, loras):
    """Loading under a name already loaded is refused, naming where it is and the fix; the first stays."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    pipe.load_lora_weights(loras[0], adapter_name="style")
    before = snapshot(pipe, cm)
    with pytest.raises(ValueError) as info:
        pipe.load_lora_weights(loras[1], adapter_name="style")
    assert str(info.value) == (
        "load_lora_weights: adapter name 'style' is already in use in ['unet', 'text_encoder']; pass another "
        "adapter_name, or pipe.delete_adapters('style') first"
    )
    assert_unchanged(before, snapshot(pipe, cm))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda pipe: pipe.set_adapters("styl"),
            ValueError,
            "set_adapters: no adapter named 'styl'; did you mean 'style'? (loaded: ['style', 'ink'])",
        ),
        (
            lambda pipe: pipe.set_adapters(["style", "ink"], adapter_weights=[0.5]),
            ValueError,
            "set_adapters: adapter_weights has 1 weights for 2 adapters ['style', 'ink']; give one weight per "
            "adapter, or one number for all",
        ),
        (
            lambda pipe: pipe.set_adapters("style", adapter_weights={"vae": 0.5}),
            ValueError,
            "set_adapters: adapter_weights names ['vae'], which take no LoRA; per-component weights are for "
            "['unet', 'text_encoder']",
        ),
        (
            lambda pipe: pipe.set_adapters("style", adapter_weights="strong"),
            TypeError,
            "set_adapters: a weight is a number, None or a per-component dict (got 'strong')",
        ),
        (
            lambda pipe: pipe.delete_adapters(["ink", "nope"]),
            ValueError,
            "delete_adapters: no adapter named 'nope' (loaded: ['style', 'ink'])",
        ),
        (
            lambda pipe: pipe.fuse_lora(components=["vae"]),
            ValueError,
            "fuse_lora: 'vae' takes no LoRA; components are among ['unet', 'text_encoder']",
        ),
        (
            lambda pipe: pipe.fuse_lora(lora_scale="high"),
            TypeError,
            "fuse_lora: lora_scale must be a number (got 'high')",
        ),
    ],
    ids=[
        "unknown_name",
        "weights_length",
        "weights_component",
        "weight_type",
        "delete_unknown",
        "fuse_vae",
        "scale",
    ],
)
def test_bad_adapter_calls_are_refused_and_change_nothing(repo, loras, call, error, message):
    """Each bad call is a clear error naming the fix, and the models and the manager stay as they were."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    pipe.load_lora_weights(loras[0], adapter_name="style")
    pipe.load_lora_weights(loras[1], adapter_name="ink")
    before = snapshot(pipe, cm)
    with pytest.raises(error) as info:
        call(pipe)
    assert str(info.value) == message
    assert_unchanged(before, snapshot(pipe, cm))


@pytest.mark.parametrize(
    "method", ["fuse_lora", "unfuse_lora", "set_adapters", "disable_lora", "delete_adapters"]
)
def test_adapter_calls_without_a_lora_are_refused(repo, method):
    """Fusing, weighting, disabling or deleting with no LoRA loaded says to load one first."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    arguments = {"set_adapters": ("a",), "delete_adapters": ("a",)}.get(method, ())
    with pytest.raises(ValueError) as info:
        getattr(pipe, method)(*arguments)
    assert str(info.value) == (
        f"{method}: no LoRA is loaded in this pipeline; load one with pipe.load_lora_weights(...) first"
    )
    assert pipe.get_list_adapters() == {} and pipe.get_active_adapters() == []
    pipe.unload_lora_weights()  # nothing to unload is not an error


def test_a_pipeline_without_a_family_or_loader_is_refused(repo, loras, monkeypatch):
    """Blocks of no family, or a family without lora_loader, get an error naming the fix."""
    toy = AddOneThenDouble().init_pipeline()
    with pytest.raises(ValueError) as info:
        toy.load_lora_weights(loras[0])
    assert str(info.value) == (
        "load_lora_weights: this pipeline cannot take a LoRA: its blocks (AddOneThenDouble) belong to no installed "
        "family. Build it from a family's blocks (e.g. ModularPipeline.from_pretrained(repo)), or register a "
        "BlockFamily with lora_loader= set to the diffusers *LoraLoaderMixin of its models "
        "(modular.register_family)."
    )
    family = BlockFamily(name="no-lora", blocks_class=AddOneThenDouble)
    monkeypatch.setattr(modular.adapters.lora, "family_of_blocks", lambda name: family)
    with pytest.raises(ValueError, match="its family 'no-lora' names no lora_loader"):
        toy.get_list_adapters()


def test_a_model_not_loaded_is_named(repo, loras):
    """Loading a LoRA before the UNet is loaded names the component and the fix."""
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(["text_encoder"], torch_dtype=torch.float32)
    with pytest.raises(ValueError, match="component 'unet' is not loaded; call pipe.load_components"):
        pipe.load_lora_weights(loras[0])
    assert lora_layers(pipe.text_encoder) == []


def test_a_load_failing_half_way_takes_its_layers_out_again(repo, loras, monkeypatch):
    """If the text encoder's part fails after the UNet's went in, the UNet is left without LoRA layers."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    before = snapshot(pipe, cm)

    def fail(cls, *args, **kwargs):
        raise RuntimeError("text encoder failed")

    monkeypatch.setattr(StableDiffusionLoraLoaderMixin, "load_lora_into_text_encoder", classmethod(fail))
    with pytest.raises(RuntimeError, match="text encoder failed"):
        pipe.load_lora_weights(loras[0])
    assert lora_layers(pipe.unet) == []
    assert_unchanged(before, snapshot(pipe, cm))


# ----- shared components and the manager's record -----


def test_a_lora_in_a_shared_component_reaches_every_pipeline_and_the_manager_says_who_loaded_it(repo, loras):
    """Two pipelines on one manager share the models: a LoRA one loads is the other's too; the manager's info
    and table show it with the loading pipeline; deleting it from the other takes it from both, and unloading
    takes the emptied layers out."""
    cm = ComponentsManager()
    first, second = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    assert first.unet is second.unet
    first.load_lora_weights(loras[0], adapter_name="style")
    first.set_adapters("style", adapter_weights={"unet": 0.8, "text_encoder": 0.5})
    assert second.get_list_adapters() == {"unet": ["style"], "text_encoder": ["style"]}
    assert same(images(first), images(second))
    label = f"StableDiffusionAutoBlocks@{id(first):#x}"
    unet_id, encoder_id = cm.get_id(first.unet), cm.get_id(first.text_encoder)
    assert cm.get_model_info(unet_id, "lora") == {
        "lora": [{"name": "style", "active": True, "weight": 0.8, "fused": False, "loaded_by": label}]
    }
    assert (
        f"{encoder_id}:\n  Adapters: ['style']\n  LoRA: style (active, weight 0.5, not fused, loaded by {label})"
        in cm.table()
    )
    second.fuse_lora()
    assert cm.get_model_info(unet_id, "lora")["lora"][0]["fused"] is True
    second.unfuse_lora()
    second.delete_adapters("style")
    assert first.get_list_adapters() == {}
    assert cm.get_model_info(unet_id, "lora") == {"lora": None}
    assert "LoRA:" not in cm.table()
    assert lora_layers(first.unet)  # deleting keeps the empty layers, as in diffusers
    first.unload_lora_weights()
    assert lora_layers(first.unet) == [] and lora_layers(first.text_encoder) == []


def test_disable_lora_shows_inactive(repo, loras):
    """After disable_lora the manager reports the adapter inactive; enable_lora makes it active again."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    pipe.load_lora_weights(loras[0], adapter_name="style")
    unet_id = cm.get_id(pipe.unet)
    pipe.disable_lora()
    assert cm.get_model_info(unet_id, "lora")["lora"][0]["active"] is False
    pipe.enable_lora()
    assert cm.get_model_info(unet_id, "lora")["lora"][0]["active"] is True


# ----- on a quantized model -----


def quantized_unet_config(backend):
    """A pipeline quantization config putting the UNet alone in int8 weights through `backend`."""
    import diffusers
    from diffusers.quantizers import PipelineQuantizationConfig

    if backend == "torchao":
        from torchao.quantization import Int8WeightOnlyConfig

        unet_config = diffusers.TorchAoConfig(Int8WeightOnlyConfig())
    else:
        unet_config = diffusers.QuantoConfig(weights_dtype="int8")
    return PipelineQuantizationConfig(quant_mapping={"unet": unet_config})


@pytest.mark.parametrize("backend", ["torchao", "quanto"])
def test_a_lora_on_a_quantized_unet_runs_as_in_the_classic_pipeline(repo, loras, backend):
    """On an int8-quantized UNet (torchao, optimum-quanto) a LoRA loads, changes the images and gives the
    classic quantized pipeline's images, loaded and fused; the manager shows both the LoRA and the quantization."""
    pytest.importorskip({"torchao": "torchao", "quanto": "optimum.quanto"}[backend])
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32, quantization_config=quantized_unet_config(backend))
    pipe.set_progress_bar_config(disable=True)
    classic = StableDiffusionPipeline.from_pretrained(
        repo,
        quantization_config=quantized_unet_config(backend),
        torch_dtype=torch.float32,
        safety_checker=None,
        requires_safety_checker=False,
    )
    classic.set_progress_bar_config(disable=True)
    baseline = images(pipe)
    for call in [lambda p: p.load_lora_weights(loras[0], adapter_name="a"), lambda p: p.fuse_lora()]:
        call(pipe)
        call(classic)
        theirs = classic(
            prompt="a cat",
            num_inference_steps=2,
            **SIZE,
            generator=torch.Generator().manual_seed(0),
            output_type="np",
        ).images
        assert same(images(pipe), theirs)
        assert not same(images(pipe), baseline)
    info = cm.get_model_info(cm.get_id(pipe.unet), ["lora", "quantization"])
    assert info["lora"][0]["fused"] is True and info["quantization"]["method"] == backend


# ----- under auto offload -----


@pytest.mark.parametrize("shrink", [True, False], ids=["victims_shrunk", "victims_whole"])
def test_under_auto_offload_outputs_equal_the_plain_run_after_every_lora_call(repo, loras, shrink):
    """With a budget that forces victims off the device (down to a resident prefix, the default, or whole),
    each LoRA call refreshes the host copy of every model it changed (re-measured at its new size), and
    outputs equal those of a pipeline without offload after each call."""
    plain = tiny_sd_pipeline(repo, ComponentsManager())
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 64 * 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    cm.offload_engine.shrink_victims = shrink
    refreshed = []
    refresh = cm.refresh_host_copy
    cm.refresh_host_copy = lambda component_id, **options: (
        refreshed.append(component_id),
        refresh(component_id, **options),
    )[1]
    models = {cm.get_id(pipe.unet), cm.get_id(pipe.text_encoder)}
    calls = [
        lambda p: p.load_lora_weights(loras[0], adapter_name="a"),
        lambda p: p.load_lora_weights(loras[1], adapter_name="b"),
        lambda p: p.set_adapters(["a", "b"], adapter_weights=[0.8, 0.4]),
        lambda p: p.fuse_lora(lora_scale=0.7),
        lambda p: p.unfuse_lora(),
        lambda p: p.delete_adapters("a"),
        lambda p: p.unload_lora_weights(),
    ]
    changes_weights = [True, True, False, True, True, True, True]
    for call, changes in zip(calls, changes_weights):
        refreshed.clear()
        call(plain)
        call(pipe)
        assert set(refreshed) == (models if changes else set())
        for model_id in models:
            assert cm.offload_engine.nbytes(model_id) == module_nbytes(cm.get_one(model_id))
        assert same(images(pipe), images(plain))
    if shrink:
        assert "shrink" in [entry.reason for entry in cm.offload_log]
    else:
        assert any(entry.evicted for entry in cm.offload_log)


@pytest.mark.gpu
def test_on_cuda_a_lora_fused_under_offload_survives_eviction(repo, loras):
    """On CUDA, with a budget that forces evictions: after loading, fusing, unfusing and deleting adapters, the
    images equal those of the same pipeline on CUDA without offload (no stale host copy comes back)."""
    plain = tiny_sd_pipeline(repo, ComponentsManager()).to("cuda")
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder)
    cm.enable_auto_cpu_offload(device="cuda", memory_reserve_margin=0)
    cm.offload_engine.memory_reserve_margin = cm.offload_engine.probe.free_bytes() - budget
    images(pipe)  # models resident on CUDA while the LoRA goes in
    for call in [
        lambda p: p.load_lora_weights(loras[0], adapter_name="a"),
        lambda p: p.load_lora_weights(loras[1], adapter_name="b"),
        lambda p: p.fuse_lora(lora_scale=0.7),
        lambda p: p.unfuse_lora(),
        lambda p: p.delete_adapters("a"),
    ]:
        call(plain)
        call(pipe)
        assert same(images(pipe), images(plain))
        assert same(images(pipe), images(plain))  # once more, after the evictions of the first run
    assert any(entry.evicted for entry in cm.offload_log)
