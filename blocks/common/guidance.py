"""Guidance as a component: the families' denoisers ask a ``guider`` (diffusers' ``diffusers.guiders``) how
many conditional and unconditional passes to run and how to combine their predictions.

The guider is made from a config (``guider_spec``) and is each pipeline's own. A call never changes it:
``call_guider`` gives the call a shallow copy that carries the call's scale and the per-step state the guider
keeps (``set_state``, its count of prepared passes, APG's momentum). ``guided_prediction`` runs the passes:

- a guider that leaves the model alone (classifier-free guidance, APG, CFG-Zero* ...) gets all its conditions
  in one batch, in the family's classic order, so the default guider equals the classic pipelines bit for bit;
- a guider that changes the model for some passes (PAG, skip-layer guidance) gets one pass per condition,
  each between its ``prepare_models`` and ``cleanup_models`` (which install and remove its attention hooks),
  as diffusers' own modular pipelines run them. ``cleanup_models`` runs even when the pass fails;
- a family whose classic PAG pipeline batches the perturbed prediction with the others (Stable Diffusion, SDXL)
  asks for that instead (``batch_perturbed_attention``): one batch, with diffusers' PAG attention processors
  on the perturbed layers during it (``perturbed_attention.py``), bit for bit the classic PAG pipelines.

A family's denoiser makes the conditional and unconditional predictions from its inputs, and any other only
by running the model the guider has changed (its hooks or the PAG processors); ``check_guider_kind`` refuses a
guider that asks for more, before any model runs.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from diffusers.configuration_utils import FrozenDict

from modular import ComponentSpec

from .perturbed_attention import PERTURBED, perturbed_attention, perturbed_self_attention

# diffusers.guiders imports diffusers.hooks, peft and transformers' models (seconds): the functions import it
# when a guider is first checked or called, not when a family's blocks are imported.
if TYPE_CHECKING:
    from diffusers.guiders.guider_utils import BaseGuidance, GuiderOutput

__all__ = [
    "GUIDER",
    "GuiderKindCheck",
    "call_guider",
    "check_guider",
    "check_guider_kind",
    "guidance_scale_of",
    "guided_prediction",
    "guider_spec",
    "neutral_scale",
    "stack_conditions",
]

GUIDER = "guider"

# What a family's denoiser hands the guider: per model input, its (conditional, unconditional) values.
ConditionInputs = dict[str, tuple[Any, Any]]
# Runs the model once on the given conditions' inputs (one dict each, in batch order); one prediction each.
Predict = Callable[[list[dict[str, Any]]], list[torch.Tensor]]


def guider_spec(**config: Any) -> ComponentSpec:
    """The ``guider`` component: ``ClassifierFreeGuidance`` made from `config` (the family's classic defaults).

    Any ``diffusers.guiders`` guider replaces it: ``pipe.update_components(guider=PerturbedAttentionGuidance(...))``.
    """
    return ComponentSpec(
        GUIDER,
        "diffusers.guiders.ClassifierFreeGuidance",
        description="How guidance combines the model's predictions (any diffusers.guiders guider).",
        config=FrozenDict(config),
        default_creation_method="from_config",
    )


def guidance_scale_of(components: Any, given: float | None, default: float) -> float:
    """The call's classifier-free guidance scale: `given` when the caller passed one (for that call only), else
    the ``guider`` component's own (so ``update_components(guider=ClassifierFreeGuidance(guidance_scale=3.0))``
    sets the scale of every call that passes none), else `default`, the family's classic scale, for blocks run
    without a guider. Every block that reads ``guidance_scale`` reads it through here, so they agree.

    A step callback that sets ``pipeline._guidance_scale`` (diffusers' CFG cutoff callbacks set 0.0) sets the
    scale of the call's remaining steps, as in the classic pipelines, which read the scale at every step."""
    from_callback = getattr(components, "_guidance_scale", None)
    if isinstance(from_callback, int | float) and not isinstance(from_callback, bool):
        return from_callback
    if given is not None:
        return given
    scale = getattr(getattr(components, GUIDER, None), "guidance_scale", None)
    return default if scale is None else scale


def neutral_scale(guider: BaseGuidance) -> float:
    """The scale at which a guider's classifier-free part does nothing (its formulation says which)."""
    return 0.0 if getattr(guider, "use_original_formulation", False) else 1.0


def call_guider(guider: BaseGuidance, guidance_scale: float | None, *, guidance_on: bool) -> BaseGuidance:
    """A copy of `guider` for one call: its classifier-free scale is the call's `guidance_scale` (when given),
    or the neutral scale when the family's rule turns classifier-free guidance off for this call
    (`guidance_on` False: e.g. Stable Diffusion's ``guidance_scale <= 1``). The pipeline's guider is untouched.

    Raises:
        TypeError: `guider` is not a diffusers guider.
    """
    from diffusers.guiders.guider_utils import BaseGuidance

    if not isinstance(guider, BaseGuidance):
        msg = (
            f"the 'guider' component must be a diffusers.guiders guider such as ClassifierFreeGuidance "
            f"(got a {type(guider).__name__}); set one with pipe.update_components(guider=...)"
        )
        raise TypeError(msg)
    guider = copy.copy(guider)  # no __init__: diffusers' guiders warn on each construction
    if not guidance_on:
        guider.guidance_scale = neutral_scale(guider)
    elif guidance_scale is not None:
        guider.guidance_scale = guidance_scale
    return guider


def _touches_models(guider: BaseGuidance) -> bool:
    from diffusers.guiders.guider_utils import BaseGuidance

    cls = type(guider)
    return (
        cls.prepare_models is not BaseGuidance.prepare_models
        or cls.cleanup_models is not BaseGuidance.cleanup_models
    )


def guided_prediction(
    guider: BaseGuidance,
    model: torch.nn.Module,
    inputs: ConditionInputs,
    predict: Predict,
    *,
    unconditional_first: bool,
    batch_perturbed_attention: bool = False,
) -> GuiderOutput:
    """The guider's combined prediction for one step (``guider.set_state`` already called for it).

    Args:
        guider: The call's guider (``call_guider``).
        model: The denoiser the guider may hook (``prepare_models`` / ``cleanup_models``).
        inputs: Per model input, its (conditional, unconditional) value; the guider picks per condition.
        predict: Runs `model` on a list of conditions' inputs batched together; returns one prediction each.
        unconditional_first: Batch unconditional conditions before conditional ones (the family's classic order,
            which keeps the default guider bit for bit equal to the classic pipeline).
        batch_perturbed_attention: Run a PAG guider's perturbed prediction in the same batch, last, with diffusers'
            PAG attention processors on its layers (the family's classic PAG pipeline does).

    Returns:
        The guider's output: ``pred`` (the guided prediction), ``pred_cond`` and ``pred_uncond``.
    """
    batches = guider.prepare_inputs(inputs)
    modules = perturbed_self_attention(guider, model) if batch_perturbed_attention else None
    if modules is not None:
        names = [getattr(batch, guider._identifier_key) for batch in batches]
        # The PAG processors attend normally on the first chunks and perturb the last one.
        rank = {"pred_uncond": 0 if unconditional_first else 1, "pred_cond": 1 if unconditional_first else 0}
        order = sorted(range(len(batches)), key=lambda k: rank.get(names[k], 2))
        context = (
            perturbed_attention(modules, with_unconditional="pred_uncond" in names)
            if PERTURBED in names
            else contextlib.nullcontext()
        )
        with context:
            predictions = predict([_fields(batches[k], inputs) for k in order])
    elif _touches_models(guider):
        for batch in batches:
            try:
                guider.prepare_models(model)
                (batch.noise_pred,) = predict([_fields(batch, inputs)])
            finally:
                guider.cleanup_models(model)
        return guider(batches)
    else:
        conditional = []
        for _ in batches:
            guider.prepare_models(model)  # counts the pass; the guider tells conditional from unconditional
            conditional.append(guider.is_conditional)
            guider.cleanup_models(model)
        order = sorted(range(len(batches)), key=lambda k: conditional[k] == unconditional_first)
        predictions = predict([_fields(batches[k], inputs) for k in order])
    for k, prediction in zip(order, predictions, strict=True):
        batches[k].noise_pred = prediction
    return guider(batches)


def _fields(batch: Any, inputs: ConditionInputs) -> dict[str, Any]:
    return {name: getattr(batch, name, None) for name in inputs}


def stack_conditions(values: Sequence[Any]) -> Any:
    """One batch from the conditions' values of one input: tensors concatenated along dim 0, lists of
    tensors (one per IP-Adapter) concatenated item by item; ``None`` when the input is absent."""
    if values[0] is None:
        return None
    if len(values) == 1:
        return values[0]
    if isinstance(values[0], list):
        return [torch.cat(items) for items in zip(*values, strict=True)]
    return torch.cat(list(values))


# The predictions a denoiser makes from its (conditional, unconditional) inputs, without changing the model.
_FROM_INPUTS = ("pred_cond", "pred_uncond")


def check_guider_kind(guider: Any, block_name: str) -> None:
    """Checks that a family's denoiser can make every prediction `guider` may ask for.

    It makes ``pred_cond`` and ``pred_uncond`` from its inputs; any other prediction only by running the model
    as the guider's own ``prepare_models`` changes it (PAG's and skip-layer guidance's hooks). A guider that
    asks for predictions made another way (LTX-2's, which its denoiser makes with model arguments of its own) is
    refused, so ``update_components`` and a saved index fail before any model runs.

    Raises:
        TypeError: `guider` is not a diffusers guider.
        ValueError: it asks for predictions this denoiser cannot make.
    """
    from diffusers.guiders.guider_utils import BaseGuidance

    if not isinstance(guider, BaseGuidance):
        msg = (
            f"{block_name}: the 'guider' component must be a diffusers.guiders guider such as "
            f"ClassifierFreeGuidance (got a {type(guider).__name__})"
        )
        raise TypeError(msg)
    others = [name for name in guider._input_predictions or [] if name not in _FROM_INPUTS]
    if others and not _touches_models(guider):
        msg = (
            f"{block_name}: {type(guider).__name__} asks for predictions {others}, which this denoiser cannot "
            f"make: it makes {list(_FROM_INPUTS)} from its inputs, and others only through a guider's own model "
            f"hooks (prepare_models), which {type(guider).__name__} does not have. Use a guider made for this "
            f"family, e.g. ClassifierFreeGuidance, PerturbedAttentionGuidance or SkipLayerGuidance"
        )
        raise ValueError(msg)


class GuiderKindCheck:
    """Mixin for a denoiser block that declares the ``guider``: its ``check_component``, which
    ``update_components`` and a saved index ask (``modular/pipeline/replacement.py``), refuses a guider it cannot serve."""

    def check_component(self, name: str, component: Any) -> None:
        """Refuses a guider this denoiser cannot serve (``check_guider_kind``), before any model runs."""
        if name == GUIDER:
            check_guider_kind(component, type(self).__name__)


def check_guider(guider: BaseGuidance, model: torch.nn.Module, model_name: str, block_name: str) -> None:
    """Checks, before any pass runs, that the denoiser can serve the guider (``check_guider_kind``) and that
    the layers it perturbs (PAG, skip-layer guidance) exist.

    Raises:
        ValueError: a layer config names blocks `model` does not have; nothing has been hooked.
    """
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    check_guider_kind(guider, block_name)
    for config in getattr(guider, "skip_layer_config", None) or []:
        if not isinstance(config.indices, list | tuple):
            # SkipLayerGuidance(skip_layer_guidance_layers=[0]) makes LayerSkipConfig(0): an int, which
            # diffusers' layer-skip hook cannot iterate (test_a_layer_config_with_an_int_index_says_how_to_fix_it).
            msg = (
                f"{block_name}: {type(guider).__name__} has a layer config with indices {config.indices!r}, which "
                f"diffusers' layer-skip hook needs as a list; give the guider "
                f"LayerSkipConfig(indices=[{config.indices!r}], fqn=...) instead"
            )
            raise ValueError(msg)
        fqn = config.fqn
        if fqn == "auto":
            fqn = next((name for name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS if hasattr(model, name)), None)
            if fqn is None:
                msg = (
                    f"{block_name}: {type(guider).__name__} finds the layers to perturb with fqn='auto', which "
                    f"only knows transformer models; {model_name} ({type(model).__name__}) needs them named: "
                    f"give the guider a LayerSkipConfig with fqn=<a ModuleList of transformer blocks>, e.g. "
                    f"'mid_block.attentions.0.transformer_blocks' for a UNet"
                )
                raise ValueError(msg)
        try:
            blocks = model.get_submodule(fqn)
        except AttributeError:
            blocks = None
        count = len(blocks) if isinstance(blocks, torch.nn.ModuleList) else 0
        missing = [i for i in config.indices if not 0 <= i < count]
        if blocks is None or not isinstance(blocks, torch.nn.ModuleList) or missing or not config.indices:
            msg = (
                f"{block_name}: {type(guider).__name__} perturbs layers {list(config.indices)} of {fqn!r}, but "
                f"{model_name} ({type(model).__name__}) "
                + (
                    f"has {count} there"
                    if isinstance(blocks, torch.nn.ModuleList)
                    else "has no list of blocks of that name"
                )
                + "; name blocks the model has (see model.named_modules()) in the guider's layer config"
            )
            raise ValueError(msg)
