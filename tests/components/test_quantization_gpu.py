"""Quantized models on CUDA: bitsandbytes loads, and real offload moves of torchao and quanto weights."""

import diffusers
import pytest
import torch
from diffusers import UNet2DConditionModel
from torchao.quantization import Int8WeightOnlyConfig

from components import ComponentsManager, ComponentSpec
from offload import OffloadEngine, module_nbytes

pytestmark = pytest.mark.gpu


def unet_spec(repo):
    return ComponentSpec("unet", UNet2DConditionModel, repo=str(repo), subfolder="unet")


def unet_output(unet, device="cuda"):
    """The UNet's noise prediction for fixed random inputs made on the CPU, then moved to `device`."""
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 32, 32, generator=generator).to(device)
    context = torch.randn(1, 77, 32, generator=generator).to(device)
    with torch.no_grad():
        return unet(sample, 10, encoder_hidden_states=context).sample


@pytest.mark.parametrize(
    ("config", "weights"),
    [
        (lambda: diffusers.BitsAndBytesConfig(load_in_8bit=True), "8-bit"),
        (lambda: diffusers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"), "4-bit nf4"),
    ],
    ids=["8bit", "4bit"],
)
def test_a_bitsandbytes_unet_loads_runs_and_shows(tiny_repo, config, weights):
    """bitsandbytes loads the UNet on CUDA through the manager; it runs, is smaller, and the table says how."""
    pytest.importorskip("bitsandbytes")
    cm = ComponentsManager()
    unet = cm.get_or_load(unet_spec(tiny_repo), quantization_config=config(), torch_dtype=torch.float16)
    plain = unet_spec(tiny_repo).load(torch_dtype=torch.float16)
    assert module_nbytes(unet) < module_nbytes(plain)
    assert torch.isfinite(unet_output(unet).float()).all()
    unet_id = cm.get_id(unet)
    assert cm.get_model_info(unet_id, "quantization")["quantization"]["weights"] == weights
    assert f"Quantization: bitsandbytes ({weights})" in cm.table()
    assert (
        cm.get_or_load(unet_spec(tiny_repo), quantization_config=config(), torch_dtype=torch.float16) is unet
    )


@pytest.mark.parametrize(
    "config",
    [
        lambda: diffusers.TorchAoConfig(Int8WeightOnlyConfig()),
        lambda: diffusers.QuantoConfig(weights_dtype="int8"),
    ],
    ids=["torchao", "quanto"],
)
def test_quantized_weights_move_to_cuda_and_back_unchanged(tiny_repo, config):
    """Offload uploads the packed weights, evicts them back to their host copy, and outputs stay equal."""
    reference = unet_spec(tiny_repo).load(quantization_config=config(), torch_dtype=torch.float32).to("cuda")
    expected = unet_output(reference)
    unet = unet_spec(tiny_repo).load(quantization_config=config(), torch_dtype=torch.float32)
    host_bytes = module_nbytes(unet)
    weight_type = (
        type(unet.conv_in.weight),
        type(unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q.weight),
    )
    engine = OffloadEngine("cuda", memory_reserve_margin=0)
    engine.attach("unet", unet)
    assert engine.nbytes("unet") == host_bytes
    assert torch.equal(unet_output(unet), expected)
    engine.evict("unet")
    assert {tensor.device.type for tensor in unet.parameters()} == {"cpu"}
    assert (
        type(unet.conv_in.weight),
        type(unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q.weight),
    ) == weight_type
    assert torch.equal(unet_output(unet), expected)
    assert engine.log.total_bytes_to_host == 0
    engine.close()
