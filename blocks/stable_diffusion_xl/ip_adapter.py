"""The image prompt of an IP-Adapter: Stable Diffusion XL's steps (the shared ones, under the family's name)."""

from __future__ import annotations

from blocks.common.ip_adapter import IPAdapterEmbedsStep, IPAdapterImageStep, IPAdapterStep

from .utils import MODEL_NAME

__all__ = [
    "StableDiffusionXLIPAdapterEmbedsStep",
    "StableDiffusionXLIPAdapterImageStep",
    "StableDiffusionXLIPAdapterStep",
]


class StableDiffusionXLIPAdapterImageStep(IPAdapterImageStep):
    """Encode the image prompt for each IP-Adapter loaded into the UNet."""

    model_name = MODEL_NAME


class StableDiffusionXLIPAdapterEmbedsStep(IPAdapterEmbedsStep):
    """Check the image-prompt embeddings against the IP-Adapters loaded into the UNet."""

    model_name = MODEL_NAME


class StableDiffusionXLIPAdapterStep(IPAdapterStep):
    """The image prompt, from images or embeddings; nothing runs without either."""

    block_classes = [StableDiffusionXLIPAdapterImageStep, StableDiffusionXLIPAdapterEmbedsStep]
