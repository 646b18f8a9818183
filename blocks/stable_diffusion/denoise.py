"""The denoising loop: per step, prepare the UNet input, predict the noise with guidance, step the scheduler."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import TimestepLoopBlocks
from blocks.common.callback_tensors import GuidanceBatch, present, take
from blocks.common.guidance import (
    GuiderKindCheck,
    call_guider,
    check_guider,
    guidance_scale_of,
    guided_prediction,
    guider_spec,
    stack_conditions,
)
from blocks.common.ip_adapter import IP_ADAPTER_DENOISER_INPUTS, denoiser_ip_embeds
from blocks.common.latent_preview import SD_LATENT_RGB
from modular import (
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
)

from .utils import (
    GUIDANCE_SCALE,
    MODEL_NAME,
    SCHEDULER,
    do_classifier_free_guidance,
    extra_step_kwargs,
    guidance_scale,
    guidance_scale_input,
)

__all__ = [
    "StableDiffusionLoopBeforeDenoiser",
    "StableDiffusionInpaintLoopBeforeDenoiser",
    "StableDiffusionLoopDenoiser",
    "StableDiffusionLoopAfterDenoiser",
    "StableDiffusionInpaintLoopAfterDenoiser",
    "StableDiffusionDenoiseLoopWrapper",
    "StableDiffusionDenoiseStep",
    "StableDiffusionInpaintDenoiseStep",
]

_UNET = ComponentSpec("unet", "diffusers.UNet2DConditionModel")
# The classic pipeline's guidance: classifier-free, scale 7.5 (the call's guidance_scale sets it per call).
GUIDER_SPEC = guider_spec(guidance_scale=7.5)


def guidance_scale_embedding(scale: torch.Tensor, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal embedding of guidance scales [B] -> [B, embedding_dim], for UNets with time_cond_proj_dim."""
    scale = scale * 1000.0
    half = embedding_dim // 2
    freq = torch.exp(torch.arange(half, dtype=dtype) * -(torch.log(torch.tensor(10000.0)) / (half - 1)))
    emb = scale.to(dtype)[:, None] * freq[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


class StableDiffusionLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: scale the latents for the scheduler (the denoiser batches them per guidance condition)."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: makes latent_model_input from latents, scaled with the scheduler's "
        "scale_model_input for timestep t (the denoiser batches one copy per guidance condition)."
    )

    expected_components = [_UNET, SCHEDULER]

    inputs = [
        InputParam(
            "latents", type_hint=torch.Tensor, required=True, description="The latents being denoised."
        ),
    ]

    def __call__(self, components, block_state, i, t):
        # Elementwise, so scaling once and batching copies equals the classic scaling of the doubled batch.
        block_state.latent_model_input = components.scheduler.scale_model_input(block_state.latents, t)
        return components, block_state


class StableDiffusionInpaintLoopBeforeDenoiser(StableDiffusionLoopBeforeDenoiser):
    """Loop step for inpainting: as the plain one, plus mask and masked-image latents for a 9-channel UNet."""

    description = (
        "Inside the loop: as StableDiffusionLoopBeforeDenoiser; for a 9-channel UNet, appends mask and "
        "masked_image_latents to latent_model_input along the channels."
    )

    inputs = [
        *StableDiffusionLoopBeforeDenoiser.inputs,
        InputParam("mask", type_hint=torch.Tensor, required=True, description="The mask at latent size."),
        InputParam(
            "masked_image_latents", type_hint=torch.Tensor, description="Latents of the masked image."
        ),
    ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        if components.unet.config.in_channels == 9:
            # The prepare step doubles mask and masked latents for classifier-free guidance (two equal halves);
            # one condition's share is the first.
            batch = block_state.latents.shape[0]
            block_state.latent_model_input = torch.cat(
                [
                    block_state.latent_model_input,
                    block_state.mask[:batch],
                    block_state.masked_image_latents[:batch],
                ],
                dim=1,
            )
        return components, block_state


class StableDiffusionLoopDenoiser(GuiderKindCheck, ModularPipelineBlocks):
    """Loop step: predict the noise with the UNet, one pass or batch per condition the guider asks for."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance) which conditions to predict at t, "
        "runs the UNet on latent_model_input with each condition's text embeddings (conditions that leave the "
        "model as it is share one batch, negatives first, and PAG's perturbed one joins it last, as in the "
        "classic PAG pipelines), and combines the predictions with the guider: "
        "noise_pred = uncond + guidance_scale * (text - uncond) by default, optionally rescaled by guidance_rescale."
    )

    expected_components = [GUIDER_SPEC, _UNET]

    inputs = [
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        guidance_scale_input(),
        InputParam(
            "guidance_rescale",
            type_hint=float,
            description="Guidance rescale factor (default: the guider's own, 0.0 for the default guider).",
        ),
        InputParam.template("cross_attention_kwargs"),
        *IP_ADAPTER_DENOISER_INPUTS,
    ]

    def _timestep_cond(self, components, block_state) -> torch.Tensor | None:
        proj_dim = components.unet.config.time_cond_proj_dim
        if proj_dim is None:
            return None
        if "timestep_cond" not in block_state:
            batch = block_state.latents.shape[0]
            scale = torch.tensor(guidance_scale(components, block_state.guidance_scale) - 1).repeat(batch)
            block_state.timestep_cond = guidance_scale_embedding(scale, proj_dim, torch.float32).to(
                device=block_state.latents.device, dtype=block_state.latents.dtype
            )
        return block_state.timestep_cond

    def call_guider(self, components, block_state):
        """The call's copy of the guider (made at the first step and checked against the UNet), made again when
        a step callback changes the scale (``pipeline._guidance_scale = 0.0``): the classic pipelines read
        ``do_classifier_free_guidance`` at every step."""
        scale = guidance_scale(components, block_state.guidance_scale)
        if "call_guider" not in block_state or block_state.__dict__.get("call_guider_scale") != scale:
            block_state.call_guider_scale = scale
            guider = call_guider(
                components.guider, scale, guidance_on=do_classifier_free_guidance(components, scale)
            )
            if block_state.guidance_rescale is not None and hasattr(guider, "guidance_rescale"):
                guider.guidance_rescale = block_state.guidance_rescale
            check_guider(guider, components.unet, "unet", type(self).__name__)
            block_state.call_guider = guider
        return block_state.call_guider

    def condition_inputs(self, components, block_state) -> dict[str, tuple[Any, Any]]:
        """Per UNet input, its (conditional, unconditional) value.

        With classifier-free guidance off there is no unconditional value and the conditional one stands in:
        diffusers' PAG guider then takes its perturbed pass's inputs from the second slot, and the classic PAG
        pipeline runs that pass on the prompt (test_pag_without_classifier_free_guidance_equals_the_classic_pag_pipeline).
        """
        guided = do_classifier_free_guidance(
            components, guidance_scale(components, block_state.guidance_scale)
        )
        name = type(self).__name__
        image_embeds = denoiser_ip_embeds(components, block_state, "unet", name)
        negative_image_embeds = image_embeds
        if guided and image_embeds is not None:
            negative_image_embeds = denoiser_ip_embeds(components, block_state, "unet", name, negative=True)
        negative = block_state.negative_prompt_embeds if guided else block_state.prompt_embeds
        return {
            "encoder_hidden_states": (block_state.prompt_embeds, negative),
            "image_embeds": (image_embeds, negative_image_embeds),
        }

    def added_conditions(self, stacked: dict[str, Any]) -> dict[str, Any]:
        """The UNet's ``added_cond_kwargs`` from the batched condition inputs (SD: only image prompts)."""
        image_embeds = stacked["image_embeds"]
        return {} if image_embeds is None else {"added_cond_kwargs": {"image_embeds": image_embeds}}

    def __call__(self, components, block_state, i, t):
        guider = self.call_guider(components, block_state)
        # The steps actually run: PNDM runs one more than num_inference_steps, and the guider's start/stop
        # window must cover them all (it is a fraction of the count it is given).
        guider.set_state(step=i, num_inference_steps=len(block_state.timesteps), timestep=t)
        inputs = self.condition_inputs(components, block_state)
        timestep_cond = self._timestep_cond(components, block_state)

        def predict(conditions: list[dict[str, Any]]) -> list[torch.Tensor]:
            count = len(conditions)
            stacked = {name: stack_conditions([c[name] for c in conditions]) for name in inputs}
            noise_pred = components.unet(
                stack_conditions([block_state.latent_model_input] * count),
                t,
                encoder_hidden_states=stacked["encoder_hidden_states"],
                timestep_cond=stack_conditions([timestep_cond] * count),
                cross_attention_kwargs=block_state.cross_attention_kwargs,
                return_dict=False,
                **self.added_conditions(stacked),
            )[0]
            return list(noise_pred.chunk(count))

        # Negatives first, and PAG's perturbed prediction in the same batch: the classic (PAG) pipelines' batch.
        block_state.noise_pred = guided_prediction(
            guider, components.unet, inputs, predict, unconditional_first=True, batch_perturbed_attention=True
        ).pred
        return components, block_state


class StableDiffusionLoopAfterDenoiser(ModularPipelineBlocks):
    """Loop step: the scheduler step from t to the next timestep."""

    model_name = MODEL_NAME

    description = "Inside the loop: latents = scheduler.step(noise_pred, t, latents) (with eta and generator where taken)."

    expected_components = [SCHEDULER]

    inputs = [InputParam.template("generator"), InputParam.template("eta")]

    def __call__(self, components, block_state, i, t):
        scheduler = components.scheduler
        kwargs = extra_step_kwargs(scheduler, block_state.generator, block_state.eta)
        block_state.latents = scheduler.step(
            block_state.noise_pred, t, block_state.latents, **kwargs, return_dict=False
        )[0]
        return components, block_state


class StableDiffusionInpaintLoopAfterDenoiser(StableDiffusionLoopAfterDenoiser):
    """Loop step for inpainting: the scheduler step, then, for a 4-channel UNet, paste back the kept area."""

    description = (
        "Inside the loop: the scheduler step; for a 4-channel UNet the area outside the mask is then "
        "replaced by image_latents noised to the next timestep."
    )

    expected_components = [_UNET, SCHEDULER]

    inputs = [
        *StableDiffusionLoopAfterDenoiser.inputs,
        InputParam("mask", type_hint=torch.Tensor, required=True, description="The mask at latent size."),
        InputParam("image_latents", type_hint=torch.Tensor, description="Scaled VAE latents of the image."),
        InputParam("noise", type_hint=torch.Tensor, description="The noise the latents started from."),
        guidance_scale_input(),
    ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        if components.unet.config.in_channels != 4:
            return components, block_state
        mask = block_state.mask
        if do_classifier_free_guidance(components, guidance_scale(components, block_state.guidance_scale)):
            mask, _ = mask.chunk(2)
        kept = block_state.image_latents
        if i < len(block_state.timesteps) - 1:
            next_t = block_state.timesteps[i + 1]
            kept = components.scheduler.add_noise(kept, block_state.noise, torch.tensor([next_t]))
        block_state.latents = (1 - mask) * kept + mask * block_state.latents
        return components, block_state


class StableDiffusionDenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own denoiser and scheduler.

    A step callback gets the tensors of the classic pipeline of its workflow, as it holds them: ``prompt_embeds``
    is the classifier-free batch ``cat([negative, positive])`` while guidance is on (the positive rows once a
    callback turns it off), ``negative_prompt_embeds`` the negative rows, which the classic loop never reads (what
    a callback returns for it changes nothing there, nor here). See ``blocks/common/callback_tensors.py``.
    """

    _callback_tensor_inputs: tuple[str, ...] = ("latents", "prompt_embeds", "negative_prompt_embeds")

    #: The tensors the classic pipeline joins into one classifier-free batch before its loop.
    guidance_batches: tuple[GuidanceBatch, ...] = (
        GuidanceBatch("prompt_embeds", "prompt_embeds", "negative_prompt_embeds"),
    )

    #: The classic scale the guidance rule falls back on for blocks run without a guider.
    classic_guidance_scale = GUIDANCE_SCALE

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, _UNET]

    # Previews of SD 1.x/2.x latents; the inpainting UNet's 9 input channels are built per step, the latents
    # stay 4 channels.
    latent_rgb_map = SD_LATENT_RGB

    def guided(self, components, block_state) -> bool:
        """Whether classifier-free guidance is on for the call's next step (a callback may have turned it off)."""
        scale = guidance_scale_of(components, block_state.guidance_scale, self.classic_guidance_scale)
        return do_classifier_free_guidance(components, scale)

    def callback_values(self, components, block_state, names):
        kept = block_state.__dict__.setdefault("callback_kept", {})
        guided = self.guided(components, block_state)
        values = block_state.__dict__
        return present(values, names, self.guidance_batches, guided, kept, type(self).__name__)

    def take_callback_values(self, components, block_state, updates):
        kept = block_state.__dict__.setdefault("callback_kept", {})
        values = block_state.__dict__
        changes = take(values, updates, self.guidance_batches, kept, type(self).__name__)
        super().take_callback_values(components, block_state, changes)


class StableDiffusionDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [
        StableDiffusionLoopBeforeDenoiser,
        StableDiffusionLoopDenoiser,
        StableDiffusionLoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (guidance doubling, "
        "scale_model_input), denoiser (UNet and guidance), after_denoiser (scheduler step)."
    )


class StableDiffusionInpaintDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The inpainting denoising loop, for 4- and 9-channel UNets."""

    # As the classic inpainting pipeline: mask and masked_image_latents doubled while guidance is on.
    _callback_tensor_inputs = (
        *StableDiffusionDenoiseLoopWrapper._callback_tensor_inputs,
        "mask",
        "masked_image_latents",
    )

    block_classes = [
        StableDiffusionInpaintLoopBeforeDenoiser,
        StableDiffusionLoopDenoiser,
        StableDiffusionInpaintLoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents for inpainting. A 9-channel UNet sees the mask and the masked image each step; "
        "with a 4-channel UNet the area outside the mask is pasted back after each step."
    )

    def take_callback_values(self, components, block_state, updates):
        """As the plain loop's; a 9-channel UNet's mask and masked-image latents must keep equal halves while
        guidance is on: both conditions of a step see the first (the classic pipeline would give each its own).

        Raises:
            ValueError: a returned mask or masked_image_latents whose halves differ (nothing is changed).
        """
        if components.unet.config.in_channels == 9 and self.guided(components, block_state):
            batch = block_state.latents.shape[0]
            for name in ("mask", "masked_image_latents"):
                value = updates.get(name)
                if value is not None and value.shape[0] == 2 * batch and not torch.equal(*value.chunk(2)):
                    msg = (
                        f"{type(self).__name__}: the step callback returned a {name!r} whose negative and positive "
                        f"halves differ; this loop gives both conditions the same one: return equal halves"
                    )
                    raise ValueError(msg)
        super().take_callback_values(components, block_state, updates)
