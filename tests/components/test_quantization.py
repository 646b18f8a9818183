"""Quantization at load time: per-component resolution, backends, reuse by config, model info and table."""

import diffusers
import pytest
import torch
import transformers
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.quantizers import PipelineQuantizationConfig
from optimum.quanto import QTensor
from torchao.quantization import Int8Tensor, Int8WeightOnlyConfig
from transformers import CLIPTextModel, CLIPTokenizer

from components import ComponentsManager, ComponentSpec
from components import quantization as quantization_module
from components.errors import QuantizationBackendError, QuantizationConfigError
from components.quantization import describe_quantization, resolve_quantization
from offload import module_nbytes
from offload.devices.units import format_bytes


def torchao_int8(library=diffusers):
    """torchao int8 weight-only, as a config of `library` (diffusers or transformers)."""
    return library.TorchAoConfig(Int8WeightOnlyConfig())


def quanto_int8(library=diffusers):
    """quanto int8 weights, as a config of `library` (the two libraries name the field differently)."""
    if library is diffusers:
        return diffusers.QuantoConfig(weights_dtype="int8")
    return transformers.QuantoConfig(weights="int8")


def spec(repo, name, cls=None):
    return ComponentSpec(name, cls, repo=str(repo), subfolder=name)


def unet_output(unet):
    """The UNet's noise prediction for fixed random inputs."""
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 32, 32, generator=generator)
    context = torch.randn(1, 77, 32, generator=generator)
    with torch.no_grad():
        return unet(sample, 10, encoder_hidden_states=context).sample


def to_q(unet):
    return unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q.weight


@pytest.fixture
def count_loads(monkeypatch):
    """Counts UNet2DConditionModel.from_pretrained calls (the real loads still run)."""
    calls = []
    original = UNet2DConditionModel.from_pretrained.__func__

    def counting(klass, *args, **kwargs):
        calls.append(kwargs.get("quantization_config"))
        return original(klass, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "from_pretrained", classmethod(counting))
    return calls


# ---- loading -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "weight_type"),
    [(torchao_int8(), Int8Tensor), (quanto_int8(), QTensor)],
    ids=["torchao", "quanto"],
)
def test_a_unet_loads_quantized_and_equals_diffusers_load(tiny_repo, config, weight_type):
    """ComponentSpec.load quantizes the linear weights, and the model computes what diffusers' own load does."""
    unet = spec(tiny_repo, "unet", UNet2DConditionModel).load(
        quantization_config=config, torch_dtype=torch.float32
    )
    plain = spec(tiny_repo, "unet", UNet2DConditionModel).load(torch_dtype=torch.float32)
    classic = UNet2DConditionModel.from_pretrained(
        tiny_repo / "unet", quantization_config=config, torch_dtype=torch.float32
    )
    assert isinstance(to_q(unet), weight_type)
    assert module_nbytes(unet) < module_nbytes(plain)
    assert torch.equal(unet_output(unet), unet_output(classic))
    assert not torch.equal(unet_output(unet), unet_output(plain))


@pytest.mark.parametrize("config", [torchao_int8(), quanto_int8()], ids=["torchao", "quanto"])
def test_a_quantized_weight_counts_its_int8_bytes_and_row_scales(tiny_repo, config):
    """A 64x64 int8 weight counts 4096 bytes plus per-row scales (and zero points), not 64*64*4 floats."""
    unet = spec(tiny_repo, "unet").load(quantization_config=config, torch_dtype=torch.float32)
    layer = unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q
    assert layer.bias is None and to_q(unet).shape == (64, 64)
    assert 64 * 64 + 64 * 4 <= module_nbytes(layer) <= 64 * 64 + 64 * (4 + 4)


@pytest.mark.parametrize("make", [torchao_int8, quanto_int8], ids=["torchao", "quanto"])
def test_a_text_encoder_loads_with_a_transformers_config(tiny_repo, make):
    """A transformers config quantizes a transformers model; its packed size is below the plain one."""
    quantized = spec(tiny_repo, "text_encoder", CLIPTextModel).load(quantization_config=make(transformers))
    plain = spec(tiny_repo, "text_encoder", CLIPTextModel).load()
    assert quantized.hf_quantizer is not None
    assert module_nbytes(quantized) < module_nbytes(plain)


def test_objects_without_weights_ignore_the_config(tiny_repo):
    """A tokenizer loads as usual when given a config (a plain value applies to every component)."""
    tokenizer = spec(tiny_repo, "tokenizer", CLIPTokenizer).load(quantization_config=torchao_int8())
    assert isinstance(tokenizer, CLIPTokenizer)


# ---- resolution per component ------------------------------------------------------------------------------


def test_a_pipeline_config_mapping_resolves_per_component():
    """quant_mapping gives each named component its config; a component it leaves out is not quantized."""
    unet_config, text_config = torchao_int8(), torchao_int8(transformers)
    config = PipelineQuantizationConfig(quant_mapping={"unet": unet_config, "text_encoder": text_config})
    assert resolve_quantization("unet", UNet2DConditionModel, config) is unet_config
    assert resolve_quantization("text_encoder", CLIPTextModel, config) is text_config
    assert resolve_quantization("vae", AutoencoderKL, config) is None
    assert resolve_quantization("tokenizer", CLIPTokenizer, config) is None


def test_a_pipeline_backend_config_gives_each_library_its_own(monkeypatch):
    """quant_backend builds diffusers' config for a diffusers model and transformers' for a transformers one."""
    monkeypatch.setattr(quantization_module, "backend_installed", lambda method: True)
    config = PipelineQuantizationConfig(
        quant_backend="bitsandbytes_8bit",
        quant_kwargs={"load_in_8bit": True},
        components_to_quantize=["unet", "text_encoder"],
    )
    unet_config = resolve_quantization("unet", UNet2DConditionModel, config)
    text_config = resolve_quantization("text_encoder", CLIPTextModel, config)
    assert isinstance(unet_config, diffusers.BitsAndBytesConfig)
    assert isinstance(text_config, transformers.BitsAndBytesConfig)
    assert unet_config.load_in_8bit and text_config.load_in_8bit
    assert resolve_quantization("vae", AutoencoderKL, config) is None


def test_spec_resolves_with_the_class_read_from_the_repo(tiny_repo):
    """A spec without type_hint reads its class from the repo to resolve a pipeline config."""
    text_config = torchao_int8(transformers)
    config = PipelineQuantizationConfig(quant_mapping={"text_encoder": text_config})
    assert spec(tiny_repo, "text_encoder").resolve_quantization(quantization_config=config) is text_config


# ---- bad input ---------------------------------------------------------------------------------------------


def test_a_diffusers_config_for_a_transformers_model_is_refused(tiny_repo):
    """The error names the component, both libraries and the fix; nothing is registered."""
    cm = ComponentsManager()
    with pytest.raises(QuantizationConfigError) as error:
        cm.get_or_load(spec(tiny_repo, "text_encoder", CLIPTextModel), quantization_config=torchao_int8())
    message = str(error.value)
    assert message.startswith(
        "Component 'text_encoder' is a transformers model "
        "(transformers.models.clip.modeling_clip.CLIPTextModel) but quantization_config is a diffusers config "
        "(TorchAoConfig). Pass transformers.TorchAoConfig(...) for it"
    )
    assert "PipelineQuantizationConfig(quant_mapping=" in message
    assert len(cm) == 0


def test_a_transformers_config_for_a_diffusers_model_is_refused(tiny_repo):
    """The other way round is refused the same way."""
    with pytest.raises(
        QuantizationConfigError, match="Component 'unet' is a diffusers model .* transformers config"
    ):
        spec(tiny_repo, "unet").load(quantization_config=quanto_int8(transformers))


@pytest.mark.parametrize("config", ["int8", {"unet": "int8"}], ids=["str", "dict"])
def test_a_value_that_is_no_config_is_refused(tiny_repo, config):
    """A string or a plain dict is a TypeError naming the component and the accepted kinds."""
    with pytest.raises(
        TypeError, match="Component 'unet': quantization_config must be a quantization config"
    ):
        spec(tiny_repo, "unet").load(quantization_config=config)


def test_a_model_of_neither_library_is_refused():
    """A plain torch module class cannot be quantized by from_pretrained: the error says to leave it out."""
    with pytest.raises(QuantizationConfigError, match="a model of neither diffusers nor transformers"):
        resolve_quantization("head", torch.nn.Linear, torchao_int8())


def test_a_gguf_config_through_from_pretrained_is_refused(tiny_repo):
    """GGUF needs a .gguf file: the error points to from_single_file and registering the model."""
    config = diffusers.GGUFQuantizationConfig(compute_dtype=torch.float32)
    with pytest.raises(QuantizationConfigError, match="UNet2DConditionModel.from_single_file\\(path"):
        spec(tiny_repo, "unet").load(quantization_config=config)


def test_a_missing_backend_names_the_package_and_the_extra(tiny_repo, monkeypatch):
    """Before any file is read, a missing backend package is an ImportError with both install commands."""
    monkeypatch.setattr(quantization_module, "backend_installed", lambda method: method != "quanto")
    cm = ComponentsManager()
    with pytest.raises(ImportError) as error:
        cm.get_or_load(spec(tiny_repo, "unet"), quantization_config=quanto_int8())
    assert isinstance(error.value, QuantizationBackendError)
    assert str(error.value) == (
        "Component 'unet': quantization_config uses quanto, whose package 'optimum-quanto' is not installed. "
        "Install it with `pip install optimum-quanto`, or every backend with "
        "`pip install 'modular-pipelines[quantization]'`."
    )
    assert len(cm) == 0


def test_backend_installed_reads_the_environment():
    """The CPU backends the test extra installs are found; a missing parent package reads as not installed."""
    assert quantization_module.backend_installed("torchao")
    assert quantization_module.backend_installed("quanto")
    quantization_module.BACKEND_PACKAGES["missing"] = ("no_such_parent.child", "no-such")
    try:
        assert not quantization_module.backend_installed("missing")
    finally:
        del quantization_module.BACKEND_PACKAGES["missing"]


# ---- reuse by the manager ----------------------------------------------------------------------------------


def test_reuse_needs_an_equal_quantization_request(tiny_repo, count_loads):
    """Equal configs (also from a pipeline config) reuse; another backend, option or none loads apart."""
    cm = ComponentsManager()

    def get(config):
        return cm.get_or_load(spec(tiny_repo, "unet"), quantization_config=config, torch_dtype=torch.float32)

    torchao = get(torchao_int8())
    assert get(torchao_int8()) is torchao
    assert get(PipelineQuantizationConfig(quant_mapping={"unet": torchao_int8()})) is torchao
    quanto = get(quanto_int8())
    skipping = get(diffusers.TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=["conv_in"]))
    plain = get(None)
    assert get(PipelineQuantizationConfig(quant_mapping={"vae": torchao_int8()})) is plain
    assert len({id(torchao), id(quanto), id(skipping), id(plain)}) == 4
    assert len(count_loads) == 4
    assert get(quanto_int8()) is quanto


def test_a_quantized_object_added_by_hand_is_reused_by_an_equal_request(tiny_repo, count_loads):
    """An object registered with add serves a request whose config equals the one it was quantized with."""
    cm = ComponentsManager()
    unet = spec(tiny_repo, "unet").load(quantization_config=torchao_int8(), torch_dtype=torch.float32)
    cm.add("unet", unet)
    request = {"quantization_config": torchao_int8(), "torch_dtype": torch.float32}
    assert cm.get_or_load(spec(tiny_repo, "unet"), **request) is unet
    assert cm.get_or_load(spec(tiny_repo, "unet"), torch_dtype=torch.float32) is not unet


# ---- model info and table ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [(torchao_int8(), "torchao (Int8WeightOnlyConfig)"), (quanto_int8(), "quanto (int8)")],
    ids=["torchao", "quanto"],
)
def test_model_info_and_table_show_method_weights_and_packed_size(tiny_repo, config, expected):
    """get_model_info summarises the quantization; the table's extra info shows it with the packed size."""
    cm = ComponentsManager()
    unet = cm.get_or_load(spec(tiny_repo, "unet"), quantization_config=config, torch_dtype=torch.float32)
    cm.get_or_load(spec(tiny_repo, "vae"), torch_dtype=torch.float32)
    unet_id = cm.get_id(unet)
    info = cm.get_model_info(unet_id)
    method, _, weights = expected.partition(" ")
    assert info["quantization"] == {"method": method, "weights": weights.strip("()"), "skipped_modules": None}
    assert info["size_gb"] * 1024**3 == module_nbytes(unet)
    table = cm.table()
    assert f"{unet_id}:\n  Quantization: {expected}, packed {format_bytes(module_nbytes(unet))}" in table
    assert "vae_" not in table.split("Additional Component Info:")[1]


def test_skipped_modules_show_in_the_table(tiny_repo):
    """Modules a config leaves unquantized by name are listed."""
    cm = ComponentsManager()
    config = diffusers.TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=["conv_in"])
    unet = cm.get_or_load(spec(tiny_repo, "unet"), quantization_config=config, torch_dtype=torch.float32)
    assert cm.get_model_info(cm.get_id(unet), "quantization")["quantization"]["skipped_modules"] == [
        "conv_in"
    ]
    assert "Quantization: torchao (Int8WeightOnlyConfig), skips ['conv_in'], packed" in cm.table()


@pytest.mark.parametrize(
    ("config", "weights"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "4-bit nf4"),
        (
            {"quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_skip_modules": ["proj_out"]},
            "8-bit",
        ),
        ({"quant_method": "quanto", "weights": "float8"}, "float8"),
        ({"quant_method": "somethingelse"}, None),
    ],
)
def test_describe_reads_each_backend(config, weights):
    """Each backend's bits or dtype is read from its own fields; an unknown backend shows its name only."""
    described = describe_quantization(torch.nn.Linear(2, 2), config)
    assert described["method"] == config["quant_method"]
    assert described["weights"] == weights
    assert described["skipped_modules"] == config.get("llm_int8_skip_modules")
