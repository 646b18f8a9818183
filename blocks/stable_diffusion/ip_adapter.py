"""The image prompt of an IP-Adapter: Stable Diffusion's steps (the shared ones, under the family's name)."""

from __future__ import annotations

from blocks.common.ip_adapter import IPAdapterEmbedsStep, IPAdapterImageStep, IPAdapterStep

from .utils import MODEL_NAME

__all__ = [
    "StableDiffusionIPAdapterEmbedsStep",
    "StableDiffusionIPAdapterImageStep",
    "StableDiffusionIPAdapterStep",
]


class StableDiffusionIPAdapterImageStep(IPAdapterImageStep):
    """Encode the image prompt for each IP-Adapter loaded into the UNet."""

    model_name = MODEL_NAME


class StableDiffusionIPAdapterEmbedsStep(IPAdapterEmbedsStep):
    """Check the image-prompt embeddings against the IP-Adapters loaded into the UNet."""

    model_name = MODEL_NAME


class StableDiffusionIPAdapterStep(IPAdapterStep):
    """The image prompt, from images or embeddings; nothing runs without either."""

    block_classes = [StableDiffusionIPAdapterImageStep, StableDiffusionIPAdapterEmbedsStep]
