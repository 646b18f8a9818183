"""Perturbed-attention guidance in one batched pass, as the classic PAG pipelines run it.

diffusers' ``PerturbedAttentionGuidance`` perturbs a whole model pass with hooks (``prepare_models``), so its
perturbed prediction is a pass of its own. The classic ``StableDiffusionPAGPipeline`` and
``StableDiffusionXLPAGPipeline`` instead run the unconditional, conditional and perturbed predictions in one UNet
call, with diffusers' PAG attention processors (``PAGCFGIdentitySelfAttnProcessor2_0``, or
``PAGIdentitySelfAttnProcessor2_0`` without classifier-free guidance) on the perturbed layers' self-attention:
the processor attends normally on the first chunks of the batch and replaces the last chunk's attention by its
value projection. The CPU kernels round differently for different batch sizes, so only the batched pass equals
the classic pipelines bit for bit (tests/blocks/test_guiders.py, test_pag_on_sd_equals_the_classic_pag_pipeline).

Here: which modules the guider's layer configs name (the self-attention modules diffusers' layer-skip hook would
perturb), and a context that sets the PAG processors on them and puts the previous ones back, also on failure.
The guidance math stays the guider's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

# diffusers' guiders and hooks import peft and transformers' models (seconds): imported when a guider is used.
if TYPE_CHECKING:
    from diffusers.guiders.guider_utils import BaseGuidance
    from diffusers.models.attention_processor import Attention

__all__ = ["PERTURBED", "perturbed_attention", "perturbed_self_attention"]

# The guider's name for the prediction made with perturbed attention.
PERTURBED = "pred_cond_skip"


def perturbed_self_attention(guider: BaseGuidance, model: torch.nn.Module) -> list[Attention] | None:
    """The self-attention modules a PAG guider perturbs in `model`, when PAG processors can serve them.

    ``None`` when `guider` is not a ``PerturbedAttentionGuidance`` or a module it names is not a diffusers
    ``Attention`` (the kind the PAG processors are written for): its own hooks then perturb a pass of its own.
    The layers are assumed checked (``check_guider``); ``fqn="auto"`` is resolved the way diffusers' hook does.
    """
    from diffusers.guiders import PerturbedAttentionGuidance
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS, _ATTENTION_CLASSES
    from diffusers.models.attention_processor import Attention

    if not isinstance(guider, PerturbedAttentionGuidance):
        return None
    found: list[Attention] = []
    for config in guider.skip_layer_config:
        fqn = config.fqn
        if fqn == "auto":
            fqn = next(name for name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS if hasattr(model, name))
        blocks = model.get_submodule(fqn)
        if not isinstance(blocks, torch.nn.ModuleList):
            return None
        for index in config.indices:
            for module in blocks[index].modules():
                # The modules diffusers' layer-skip hook perturbs: attention that is not cross-attention.
                if not isinstance(module, _ATTENTION_CLASSES) or module.is_cross_attention:
                    continue
                if not isinstance(module, Attention):
                    return None
                found.append(module)
    return found or None


@contextlib.contextmanager
def perturbed_attention(modules: list[Attention], with_unconditional: bool) -> Iterator[None]:
    """While inside, `modules` run diffusers' PAG processors on a batch whose last chunk is the perturbed one.

    Args:
        modules: From ``perturbed_self_attention``.
        with_unconditional: The batch is (unconditional, conditional, perturbed); else (conditional, perturbed).
    """
    from diffusers.models.attention_processor import (
        PAGCFGIdentitySelfAttnProcessor2_0,
        PAGIdentitySelfAttnProcessor2_0,
    )

    processor = (
        PAGCFGIdentitySelfAttnProcessor2_0() if with_unconditional else PAGIdentitySelfAttnProcessor2_0()
    )
    previous = [module.processor for module in modules]
    try:
        for module in modules:
            module.set_processor(processor)
        yield
    finally:
        for module, original in zip(modules, previous, strict=True):
            module.set_processor(original)
