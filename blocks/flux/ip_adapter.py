"""The image prompt of an IP-Adapter for Flux: as the shared steps, with FluxPipeline's defaults.

Where the classic FluxPipeline lacks an image prompt for one side of true CFG, it encodes a black image;
so do these steps. Embeddings without negative ones cannot be completed that way, so true CFG refuses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from blocks.common.ip_adapter import IPAdapterEmbedsStep, IPAdapterImageStep, IPAdapterStep
from modular import BlockState, InputParam

from .encoders import NEGATIVE_PROMPT, TRUE_CFG_SCALE
from .utils import MODEL_NAME

__all__ = ["FluxIPAdapterEmbedsStep", "FluxIPAdapterImageStep", "FluxIPAdapterStep"]


def _black_image() -> np.ndarray:
    # Any size: the feature extractor resizes and crops, and black stays black.
    return np.zeros((64, 64, 3), dtype=np.uint8)


class FluxIPAdapterImageStep(IPAdapterImageStep):
    """Encode the image prompt for each IP-Adapter loaded into the transformer; a missing side is black."""

    model_name = MODEL_NAME
    denoiser_name = "transformer"

    def default_positive(self, components: Any, block_state: BlockState, count: int) -> list[Any]:
        return [_black_image()] * count

    def default_negative(
        self, components: Any, projection: torch.nn.Module, pixels: torch.Tensor, positive: torch.Tensor
    ) -> torch.Tensor:
        return self.encode(components, self.pixels(components, _black_image()), hidden_states=False)


class FluxIPAdapterEmbedsStep(IPAdapterEmbedsStep):
    """Check the image-prompt embeddings against the IP-Adapters loaded into the transformer."""

    model_name = MODEL_NAME
    denoiser_name = "transformer"

    inputs = [
        *IPAdapterEmbedsStep.inputs,
        TRUE_CFG_SCALE,
        NEGATIVE_PROMPT,
        InputParam.template("negative_prompt_embeds"),
    ]

    def default_negative(
        self, block_state: BlockState, positive: list[torch.Tensor]
    ) -> list[torch.Tensor] | None:
        has_negative = (
            block_state.negative_prompt is not None or block_state.negative_prompt_embeds is not None
        )
        if block_state.true_cfg_scale > 1 and has_negative:
            msg = (
                f"{type(self).__name__}: true CFG (true_cfg_scale > 1 with a negative prompt) needs "
                "negative_ip_adapter_image_embeds beside ip_adapter_image_embeds; pass them, or pass "
                "ip_adapter_image so that the image encoder makes them"
            )
            raise ValueError(msg)
        return None


class FluxIPAdapterStep(IPAdapterStep):
    """The image prompt, from images or embeddings; nothing runs without either."""

    block_classes = [FluxIPAdapterImageStep, FluxIPAdapterEmbedsStep]
