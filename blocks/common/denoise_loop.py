"""The denoising loop every family runs: its sub-blocks once per timestep, on one shared block state."""

from __future__ import annotations

from typing import Any

import torch

from modular import InputParam, LoopSequentialPipelineBlocks, OutputParam, PipelineState
from modular.framework.call_watch import watch_of

from .lora_scale import denoiser_weights_kept_at_scale_zero

__all__ = ["TimestepLoopBlocks", "progress_ticks"]


class TimestepLoopBlocks(LoopSequentialPipelineBlocks):
    """Runs its sub-blocks once per timestep (``i``, ``t``) on one shared block state.

    A family subclasses it, names its denoiser and scheduler in ``loop_expected_components`` and
    lists the per-step blocks in ``block_classes``: every family's step prepares the model input
    (``before_denoiser``), predicts (``denoiser``) and steps the scheduler (``after_denoiser``).
    """

    block_names = ["before_denoiser", "denoiser", "after_denoiser"]

    # What every classic pipeline's callback_on_step_end offers; a family adds the rest of its own.
    _callback_tensor_inputs: tuple[str, ...] = ("latents",)

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
        attention_kwargs = values.get("cross_attention_kwargs") or values.get("joint_attention_kwargs")
        watch = watch_of(components)  # None unless the call asked for callbacks, cancel, progress or previews
        if watch is not None:
            watch.loop_started(self, len(block_state.timesteps))
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


def progress_ticks(timesteps: int, num_inference_steps: int, order: int) -> list[bool]:
    """Which timesteps move the progress bar, as the classic pipelines count them: one tick per step of the
    scheduler (a second-order scheduler takes two timesteps a step; PNDM's warm-up adds timesteps), so the
    bar ends at its total, ``2/2``, never ``3it``."""
    warmup = max(timesteps - num_inference_steps * order, 0)
    return [i == timesteps - 1 or (i + 1 > warmup and (i + 1) % order == 0) for i in range(timesteps)]
