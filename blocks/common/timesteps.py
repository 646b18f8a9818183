"""Timestep rules several families share: the flow-matching shift ``mu`` and image-to-image's cut by strength."""

from __future__ import annotations

from typing import Any

import torch

from modular import BlockState, ModularPipelineBlocks, PipelineState

from .params import LATENT_TIMESTEP_OUTPUT, TIMESTEPS_OUTPUTS

__all__ = [
    "StrengthTimestepsStep",
    "calculate_shift",
    "scheduler_mu",
    "flow_kept_steps",
    "checked_strength",
    "strength_timesteps",
]


def calculate_shift(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """The timestep shift ``mu`` for a sequence of `image_seq_len` tokens, linear between the two anchors.

    Computed in the classic pipelines' order (slope, intercept, then mu), so mu is the same to the bit.
    """
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + (base_shift - slope * base_seq_len)


def scheduler_mu(scheduler: Any, image_seq_len: int) -> float:
    """``calculate_shift`` with the anchors the scheduler's config names (FLUX.1's values by default)."""
    config = scheduler.config
    return calculate_shift(
        image_seq_len,
        config.get("base_image_seq_len", 256),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.5),
        config.get("max_shift", 1.15),
    )


def flow_kept_steps(steps: int, strength: float) -> int:
    """How many of `steps` steps image-to-image runs at `strength` in the flow-matching pipelines (Flux,
    Z-Image), which count in floats."""
    return steps - int(max(steps - min(steps * strength, steps), 0))


def checked_strength(block: object, strength: float | None, default: float) -> float:
    """`strength` (`default` when None), which must be in [0, 1]."""
    strength = default if strength is None else strength
    if not 0 <= strength <= 1:
        msg = f"{type(block).__name__}: strength must be in [0, 1] (got {strength})"
        raise ValueError(msg)
    return strength


def strength_timesteps(block: object, scheduler: Any, steps: int, kept: int, strength: float) -> torch.Tensor:
    """The last `kept` of the scheduler's `steps` timesteps, with the scheduler told to begin there.

    Raises:
        ValueError: when `strength` keeps no step.
    """
    if kept < 1:
        msg = (
            f"{type(block).__name__}: strength {strength} with num_inference_steps {steps} leaves "
            f"{kept} denoising steps; raise strength or num_inference_steps"
        )
        raise ValueError(msg)
    first = (steps - kept) * scheduler.order
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(first)
    return scheduler.timesteps[first:]


class StrengthTimestepsStep(ModularPipelineBlocks):
    """Image-to-image timesteps: the scheduler's, of which only the last ``strength`` part runs.

    Denoising then starts from the reference image noised to the first kept timestep
    (``latent_timestep``, once per image). A family subclass declares ``expected_components`` and
    ``inputs`` (``strength``, ``batch_size`` and ``num_images_per_prompt`` among them), sets
    ``default_strength`` and implements :meth:`set_timesteps` and :meth:`kept_steps`.
    """

    default_strength: float

    intermediate_outputs = [*TIMESTEPS_OUTPUTS, LATENT_TIMESTEP_OUTPUT]

    def set_timesteps(self, components: Any, block_state: BlockState) -> int:
        """Set the scheduler's full schedule for the call; return its number of steps."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement set_timesteps(components, block_state)"
        )

    def kept_steps(self, steps: int, strength: float) -> int:
        """How many of `steps` steps run at `strength`, counted as the family's classic pipeline counts."""
        raise NotImplementedError(f"{type(self).__name__} must implement kept_steps(steps, strength)")

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        strength = checked_strength(self, block_state.strength, self.default_strength)
        steps = self.set_timesteps(components, block_state)
        kept = self.kept_steps(steps, strength)
        timesteps = strength_timesteps(self, components.scheduler, steps, kept, strength)
        block_state.timesteps, block_state.num_inference_steps = timesteps, kept
        block_state.latent_timestep = timesteps[:1].repeat(
            block_state.batch_size * block_state.num_images_per_prompt
        )
        self.set_block_state(state, block_state)
        return components, state
