"""The denoising loop every family runs: its sub-blocks once per timestep, on one shared block state."""

from __future__ import annotations

from typing import Any

import torch

from modular import (
    InputParam,
    LoopSequentialPipelineBlocks,
    ModularPipelineBlocks,
    OutputParam,
    PipelineState,
)
from modular.watch.watch import watch_of

from .latent_preview import LatentRGBMap, check_latent_channels, decoded_preview_images
from .lora_scale import denoiser_weights_kept_at_scale_zero

__all__ = ["TimestepLoopBlocks", "progress_ticks"]


class SchedulerStepAfterDenoiser(ModularPipelineBlocks):
    """Loop step: ``latents = scheduler.step(noise_pred, t, latents)``, as the flow-matching families take it
    after their denoiser. A family subclasses it with its ``model_name`` and its scheduler's spec as
    ``expected_components``."""

    description = "Inside the loop: latents = scheduler.step(noise_pred, t, latents)."

    def __call__(self, components, block_state, i, t):
        block_state.latents = components.scheduler.step(
            block_state.noise_pred, t, block_state.latents, return_dict=False
        )[0]
        return components, block_state


class TimestepLoopBlocks(LoopSequentialPipelineBlocks):
    """Runs its sub-blocks once per timestep (``i``, ``t``) on one shared block state.

    A family subclasses it, names its denoiser and scheduler in ``loop_expected_components`` and
    lists the per-step blocks in ``block_classes``: every family's step prepares the model input
    (``before_denoiser``), predicts (``denoiser``) and steps the scheduler (``after_denoiser``).
    """

    block_names = ["before_denoiser", "denoiser", "after_denoiser"]

    # What every classic pipeline's callback_on_step_end offers; a family adds the rest of its own.
    _callback_tensor_inputs: tuple[str, ...] = ("latents",)

    #: The family's latent-to-RGB map for previews without a preview decoder (blocks/common/latent_preview.py);
    #: ``None``: previews need ``preview_decoder=``.
    latent_rgb_map: LatentRGBMap | None = None

    description = (
        "Denoising loop: runs its sub-blocks once per timestep, in order, on one shared block state."
    )

    @property
    def loop_inputs(self) -> list[InputParam]:
        return [
            InputParam(
                "timesteps", type_hint=torch.Tensor, required=True, description="The timesteps to denoise at."
            ),
            InputParam(
                "num_inference_steps", type_hint=int, required=True, description="The number of steps."
            ),
        ]

    @property
    def loop_intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("latents", type_hint=torch.Tensor, description="The denoised latents.")]

    @torch.no_grad()
    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        denoisers = [getattr(components, spec.name, None) for spec in self.loop_expected_components]
        values = block_state.__dict__
        attention_kwargs = (
            values.get("cross_attention_kwargs")
            or values.get("joint_attention_kwargs")
            or values.get("attention_kwargs")  # Qwen-Image's and Wan's name for them
        )
        watch = watch_of(components)  # None unless the call asked for callbacks, cancel, progress or previews
        if watch is not None:
            watch.loop_started(self, len(block_state.timesteps), block_state)
        ticks = progress_ticks(
            len(block_state.timesteps),
            block_state.num_inference_steps,
            getattr(getattr(components, "scheduler", None), "order", 1),
        )
        with (
            denoiser_weights_kept_at_scale_zero(denoisers, attention_kwargs),
            self.progress_bar(total=sum(ticks)) as progress_bar,
        ):
            for i, t in enumerate(block_state.timesteps):
                if watch is not None and watch.stops_before_step(i):
                    break  # interrupted: the classic pipelines skip the remaining steps and decode
                components, block_state = self.loop_step(components, block_state, i=i, t=t)
                if watch is not None:
                    watch.step_finished(self, components, block_state, t)
                if ticks[i]:
                    progress_bar.update()
        self.set_block_state(state, block_state)
        return components, state

    # ----- previews (modular/watch/watch.py asks for them every preview_every steps) -----
    def offers_previews(self, decoder: Any = None) -> bool:
        """Previews with a preview decoder, or with the family's :attr:`latent_rgb_map`."""
        return decoder is not None or self.latent_rgb_map is not None

    def preview_latents(self, components: Any, block_state: Any) -> torch.Tensor:
        """The current latents as images [B, C, H, W]; a family that packs them (Flux) unpacks them here.

        Never the doubled batch of classifier-free guidance: our loops keep one copy of the latents and batch
        the copies per model call."""
        return block_state.latents

    def preview_images(self, components: Any, block_state: Any, decoder: Any = None) -> list[Any]:
        """One RGB ``PIL.Image.Image`` per image of the batch, from the current latents (left as they are):
        by ``decoder`` (at its output size), or by the family's map (at the latents' size)."""
        latents = self.preview_latents(components, block_state)
        if decoder is not None:
            return decoded_preview_images(decoder, latents)
        if self.latent_rgb_map is None:
            return super().preview_images(components, block_state, decoder)
        return self.latent_rgb_map.images(latents)

    def check_previews(self, components: Any, decoder: Any = None) -> None:
        """Before the run: the map or ``decoder`` reads latents of the loaded VAE's number of channels.

        Raises:
            ValueError: they do not (a tiny test VAE, or a decoder of another latent space).
        """
        vae = getattr(components, "vae", None)
        channels = getattr(getattr(vae, "config", None), "latent_channels", None)
        if channels is None:
            return  # no VAE to tell: checked on the latents at the first preview
        if decoder is not None:
            wanted, reader = getattr(decoder.config, "latent_channels", None), type(decoder).__name__
        elif self.latent_rgb_map is not None:
            wanted, reader = self.latent_rgb_map.channels, f"the {self.latent_rgb_map.name} latent-to-RGB map"
        else:
            return
        check_latent_channels(int(channels), wanted, reader)


def progress_ticks(timesteps: int, num_inference_steps: int, order: int) -> list[bool]:
    """Which timesteps move the progress bar, as the classic pipelines count them: one tick per step of the
    scheduler (a second-order scheduler takes two timesteps a step; PNDM's warm-up adds timesteps), so the
    bar ends at its total, ``2/2``, never ``3it``."""
    warmup = max(timesteps - num_inference_steps * order, 0)
    return [i == timesteps - 1 or (i + 1 > warmup and (i + 1) % order == 0) for i in range(timesteps)]
