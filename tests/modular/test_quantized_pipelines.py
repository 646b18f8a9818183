"""Quantized pipelines: load_components' forms, parity with diffusers' quantized loads, sharing, offload, GGUF."""

import diffusers
import gguf
import pytest
import torch
import transformers
from diffusers import FluxPipeline, FluxTransformer2DModel, GGUFQuantizationConfig, StableDiffusionPipeline
from diffusers.quantizers import PipelineQuantizationConfig
from torchao.quantization import Int8WeightOnlyConfig

from blocks.flux import make_tiny_repo as make_tiny_flux_repo
from components import quantization as quantization_module
from components.errors import QuantizationBackendError, QuantizationConfigError
from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes

MODELS = ("unet", "text_encoder", "vae")


def torchao_mapping():
    """torchao int8 weight-only for the UNet and the text encoder, each in its library's config."""
    return PipelineQuantizationConfig(
        quant_mapping={
            "unet": diffusers.TorchAoConfig(Int8WeightOnlyConfig()),
            "text_encoder": transformers.TorchAoConfig(Int8WeightOnlyConfig()),
        }
    )


def quanto_mapping():
    """quanto int8 weights for the UNet and the text encoder, each in its library's config."""
    return PipelineQuantizationConfig(
        quant_mapping={
            "unet": diffusers.QuantoConfig(weights_dtype="int8"),
            "text_encoder": transformers.QuantoConfig(weights="int8"),
        }
    )


MAPPINGS = {"torchao": torchao_mapping, "quanto": quanto_mapping}


def quantized_pipeline(repo, cm, **load_options):
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32, **load_options)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe):
    generator = torch.Generator().manual_seed(0)
    return pipe(prompt="a cat", num_inference_steps=2, generator=generator, output_type="pt", output="images")


def quantized_names(pipe):
    return [name for name in MODELS if getattr(pipe.components[name], "hf_quantizer", None) is not None]


@pytest.mark.parametrize("backend", list(MAPPINGS))
def test_output_equals_the_classic_pipeline_loaded_with_the_same_config(repo, backend):
    """Bit for bit: the same config quantizes the same weights the same way, and CPU int8 kernels are exact."""
    pipe = quantized_pipeline(repo, ComponentsManager(), quantization_config=MAPPINGS[backend]())
    classic = StableDiffusionPipeline.from_pretrained(
        repo,
        quantization_config=MAPPINGS[backend](),
        torch_dtype=torch.float32,
        safety_checker=None,
        requires_safety_checker=False,
    )
    classic.set_progress_bar_config(disable=True)
    theirs = classic(
        prompt="a cat", num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="pt"
    ).images
    assert quantized_names(pipe) == ["unet", "text_encoder"]
    assert torch.equal(run(pipe), theirs)
    assert not torch.equal(run(quantized_pipeline(repo, ComponentsManager())), theirs)


def test_the_dict_form_quantizes_only_the_named_component(repo):
    """{"unet": config, "default": None}: the UNet is quantized, every other model is not."""
    config = {"unet": diffusers.TorchAoConfig(Int8WeightOnlyConfig()), "default": None}
    pipe = quantized_pipeline(repo, ComponentsManager(), quantization_config=config)
    assert quantized_names(pipe) == ["unet"]


def test_pipelines_share_a_quantized_model_only_under_an_equal_request(repo):
    """An equal request (here a per-model dict equal to the pipeline config) reuses; no config loads apart."""
    cm = ComponentsManager()
    first = quantized_pipeline(repo, cm, quantization_config=torchao_mapping())
    same = {
        "unet": diffusers.TorchAoConfig(Int8WeightOnlyConfig()),
        "text_encoder": transformers.TorchAoConfig(Int8WeightOnlyConfig()),
        "default": None,
    }
    second = quantized_pipeline(repo, cm, quantization_config=same)
    plain = quantized_pipeline(repo, cm)
    assert all(second.components[name] is first.components[name] for name in MODELS)
    assert plain.unet is not first.unet and plain.text_encoder is not first.text_encoder
    assert plain.vae is first.vae  # no pipeline asked to quantize it
    assert sorted(cm.get_ids("unet")) == sorted([cm.get_id(first.unet), cm.get_id(plain.unet)])
    extras = cm.table().split("Additional Component Info:")[1]
    assert cm.get_id(first.unet) in extras and cm.get_id(plain.unet) not in extras


@pytest.mark.parametrize("backend", list(MAPPINGS))
def test_offloaded_quantized_run_equals_the_plain_run(repo, backend):
    """With a budget that forces evictions, outputs are bit-equal and models count at their packed size."""
    cm = ComponentsManager()
    pipe = quantized_pipeline(repo, cm, quantization_config=MAPPINGS[backend]())
    expected = run(pipe)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    assert torch.equal(run(pipe), expected)
    assert torch.equal(run(pipe), expected)
    assert any(entry.evicted for entry in cm.offload_log)
    engine = cm.offload_engine
    for model in (pipe.unet, pipe.text_encoder):
        assert engine.nbytes(cm.get_id(model)) == module_nbytes(model)


def test_a_model_quantized_while_offload_is_on_is_placed_at_its_packed_size(repo):
    """Loading a quantized model under auto offload attaches it; it runs and counts packed bytes."""
    cm = ComponentsManager()
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    pipe = quantized_pipeline(repo, cm, quantization_config=torchao_mapping())
    expected = run(quantized_pipeline(repo, ComponentsManager(), quantization_config=torchao_mapping()))
    assert torch.equal(run(pipe), expected)
    unet_id = cm.get_id(pipe.unet)
    assert cm.is_auto_offloaded(pipe.unet)
    assert cm.offload_engine.nbytes(unet_id) == module_nbytes(pipe.unet)


# ---- bad input leaves the pipeline and the manager as they were --------------------------------------------


def refused_load(repo, error, match, **load_options):
    """load_components raises `error` matching `match`; the pipeline and the manager are as before the call."""
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    registered = dict(cm.components)
    with pytest.raises(error, match=match):
        pipe.load_components(**load_options)
    assert all(pipe.components[name] is None for name in MODELS)
    assert cm.components == registered


def test_a_diffusers_config_for_every_component_fails_before_loading(repo):
    """A plain diffusers config reaches the text encoder too: refused before the UNet is loaded."""
    config = diffusers.TorchAoConfig(Int8WeightOnlyConfig())
    match = "Component 'text_encoder' is a transformers model"
    refused_load(repo, QuantizationConfigError, match, quantization_config=config)


def test_a_pipeline_config_naming_an_unknown_component_is_refused(repo):
    """A misspelt name would leave its component unquantized: refused, naming it and the real components."""
    config = PipelineQuantizationConfig(
        quant_mapping={"unte": diffusers.TorchAoConfig(Int8WeightOnlyConfig())}
    )
    match = r"names component\(s\) \['unte'\] that this pipeline does not have; its components are \['"
    refused_load(repo, ValueError, match, quantization_config=config)


def test_a_missing_backend_fails_before_loading(repo, monkeypatch):
    """A backend that is not installed fails the call with the install command; nothing is loaded."""
    monkeypatch.setattr(quantization_module, "backend_installed", lambda method: method != "quanto")
    match = r"package 'optimum-quanto' is not installed.*pip install 'modular-pipelines\[quantization\]'"
    refused_load(repo, QuantizationBackendError, match, quantization_config=quanto_mapping())


# ---- GGUF: a transformer from a single .gguf file ----------------------------------------------------------


def write_gguf(state_dict, path):
    """Write `state_dict` to a .gguf file: 2-D weights whose rows fit Q8_0 blocks as Q8_0, the rest as F32."""
    writer = gguf.GGUFWriter(str(path), arch="flux")
    for name, tensor in state_dict.items():
        array = tensor.float().numpy()
        if array.ndim == 2 and array.shape[-1] % 32 == 0:  # Q8_0 packs rows in blocks of 32 values
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_transformer_runs_in_the_pipeline_shown_and_offloaded(tmp_path):
    """A Q8_0 .gguf transformer (diffusers dequantizes on CPU) equals the classic pipeline, shows in the table,
    and runs the same under auto offload."""
    flux_repo = make_tiny_flux_repo(tmp_path / "tiny-flux")
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(flux_repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    write_gguf(pipe.transformer.state_dict(), tmp_path / "transformer-q8.gguf")
    transformer = FluxTransformer2DModel.from_single_file(
        str(tmp_path / "transformer-q8.gguf"),
        config=str(flux_repo),
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
    )
    plain = pipe.transformer
    pipe.update_components(transformer=transformer)
    cm.remove(cm.get_id(plain))
    names = ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")
    classic = FluxPipeline(**{name: pipe.components[name] for name in names})
    classic.set_progress_bar_config(disable=True)
    inputs = {"prompt": "a cat", "height": 32, "width": 32, "num_inference_steps": 2, "output_type": "pt"}
    theirs = classic(generator=torch.Generator().manual_seed(0), **inputs).images
    ours = pipe(generator=torch.Generator().manual_seed(0), output="images", **inputs)
    assert torch.equal(ours, theirs)

    transformer_id = cm.get_id(transformer)
    assert module_nbytes(transformer) < module_nbytes(plain) / 2
    assert cm.get_model_info(transformer_id, "quantization")["quantization"] == {
        "method": "gguf",
        "weights": "Q8_0",
        "skipped_modules": None,
    }
    assert f"{transformer_id}:\n  Quantization: gguf (Q8_0), packed" in cm.table()

    largest = max(
        module_nbytes(model) for model in cm.components.values() if isinstance(model, torch.nn.Module)
    )
    cm.enable_auto_cpu_offload(device=SimulatedDevice(largest + 1024), memory_reserve_margin=0)
    assert torch.equal(pipe(generator=torch.Generator().manual_seed(0), output="images", **inputs), ours)
    assert any(entry.evicted for entry in cm.offload_log)
    assert cm.offload_engine.nbytes(transformer_id) == module_nbytes(transformer)


def test_a_torchao_model_in_bfloat16_among_float32_ones_is_refused_before_any_model_runs(repo):
    """torchao loads the UNet in bfloat16 when no torch_dtype is given, the text encoder loads in float32: the
    call is refused before the text encoder runs, naming both models, their dtypes and the fix."""
    pipe = ModularPipeline.from_pretrained(repo, components_manager=ComponentsManager())
    pipe.load_components(quantization_config={"unet": diffusers.TorchAoConfig(Int8WeightOnlyConfig())})
    pipe.set_progress_bar_config(disable=True)
    assert (pipe.unet.dtype, pipe.text_encoder.dtype) == (torch.bfloat16, torch.float32)
    encoded = []
    pipe.text_encoder.register_forward_hook(lambda *args: encoded.append(True))
    with pytest.raises(ValueError) as info:
        run(pipe)
    assert str(info.value).startswith(
        "StableDiffusionCheckInputsStep: the models text_encoder (torch.float32), unet (torch.bfloat16) are loaded "
        "in different dtypes, and each runs on the others' outputs; load them in one: "
        "pipe.load_components(torch_dtype=...) with one of ['torch.bfloat16', 'torch.float32'] for all of them "
        "(a torchao-quantized model loaded without torch_dtype is torch.bfloat16)"
    )
    assert encoded == []


@pytest.mark.parametrize("backend", list(MAPPINGS))
def test_a_quantized_pipeline_under_offload_takes_callbacks_previews_and_a_cancel(repo, backend):
    """Step callbacks, previews and a cancel meet quantized models under offload: a callback that changes
    nothing and previews leave the output equal; a cancel at step 1 raises and the next call is equal."""
    from modular import CallCancelled, CancelToken

    cm = ComponentsManager()
    pipe = quantized_pipeline(repo, cm, quantization_config=MAPPINGS[backend]())
    expected = run(pipe)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    generator = torch.Generator().manual_seed(0)
    previews = []
    watched = pipe(
        prompt="a cat",
        num_inference_steps=2,
        generator=generator,
        output_type="pt",
        output="images",
        callback_on_step_end=lambda pipeline, step, timestep, tensors: {},
        on_preview=previews.append,
    )
    assert torch.equal(watched, expected)
    assert [p.step for p in previews] == list(range(1, previews[0].total + 1))  # PNDM: one timestep more
    token = CancelToken()

    def cancel_at_step_1(event):
        if event.kind == "step" and event.step == 1:
            token.cancel()

    with pytest.raises(CallCancelled):
        pipe(
            prompt="a cat",
            num_inference_steps=2,
            output_type="pt",
            cancel=token,
            on_progress=cancel_at_step_1,
        )
    assert cm.offload_engine.running_ids() == []
    assert torch.equal(run(pipe), expected)
