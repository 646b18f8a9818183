"""A family names its LoRA and IP-Adapter loaders by class or by dotted path, imported when first needed."""

import pytest
from diffusers.loaders import (
    Flux2LoraLoaderMixin,
    FluxIPAdapterMixin,
    QwenImageLoraLoaderMixin,
    SD3LoraLoaderMixin,
    StableDiffusionLoraLoaderMixin,
    WanLoraLoaderMixin,
    ZImageLoraLoaderMixin,
)

import blocks.flux
import blocks.flux2
import blocks.qwenimage
import blocks.sd3
import blocks.stable_diffusion
import blocks.wan
import blocks.z_image
from modular import BlockFamily, SequentialPipelineBlocks


def test_the_families_loaders_resolve_to_diffusers_classes():
    assert blocks.stable_diffusion.FAMILY.loader("lora") is StableDiffusionLoraLoaderMixin
    assert blocks.flux.FAMILY.loader("ip_adapter") is FluxIPAdapterMixin
    assert blocks.z_image.FAMILY.loader("lora") is ZImageLoraLoaderMixin
    assert blocks.z_image.FAMILY.loader("ip_adapter") is None
    assert blocks.flux2.FAMILY.loader("lora") is Flux2LoraLoaderMixin
    assert blocks.sd3.FAMILY.loader("lora") is SD3LoraLoaderMixin
    assert blocks.qwenimage.FAMILY.loader("lora") is QwenImageLoraLoaderMixin
    assert blocks.wan.FAMILY.loader("lora") is WanLoraLoaderMixin


def test_a_class_is_returned_as_it_is():
    family = BlockFamily(
        name="x", blocks_class=SequentialPipelineBlocks, lora_loader=StableDiffusionLoraLoaderMixin
    )
    assert family.loader("lora") is StableDiffusionLoraLoaderMixin


def test_a_path_that_names_no_class_is_a_clear_error():
    family = BlockFamily(
        name="x", blocks_class=SequentialPipelineBlocks, lora_loader="diffusers.loaders.NoSuchMixin"
    )
    with pytest.raises(
        TypeError, match="family 'x': lora_loader 'diffusers.loaders.NoSuchMixin' names no class"
    ):
        family.loader("lora")
