"""How every family assembles its workflows: the same seven stages, each chosen by the inputs given.

A family's ``modular_blocks.py`` lists, per stage, which of its steps serve which workflow; the stage
names, the order they run in and the way a choice is described are the same for every family.
"""

from __future__ import annotations

from collections.abc import Sequence

from modular import AutoPipelineBlocks, SequentialPipelineBlocks

__all__ = [
    "IMAGE2IMAGE",
    "INPAINTING",
    "STAGES",
    "TEXT2IMAGE",
    "ChosenByInputs",
    "FamilyBlocks",
    "describe_choice",
]

STAGES = ("check_inputs", "text_encoder", "input", "vae_encoder", "before_denoise", "denoise", "decode")
"""The stages of every family's pipeline, in the order they run."""

# The inputs each named workflow needs (a family's ``_workflow_map`` names the ones it runs).
TEXT2IMAGE = {"prompt": True}
IMAGE2IMAGE = {"image": True, "prompt": True}
INPAINTING = {"mask_image": True, "image": True, "prompt": True}


def describe_choice(names: Sequence[str], triggers: Sequence[str | None]) -> str:
    """``"`a` when x is given, `b` otherwise"``: which branch runs for which inputs, in priority order."""
    parts = [
        f"`{name}` when {trigger} is given" if trigger else f"`{name}` otherwise"
        for name, trigger in zip(names, triggers)
    ]
    if None not in triggers:
        parts.append("nothing otherwise")
    return ", ".join(parts)


class ChosenByInputs(AutoPipelineBlocks):
    """A stage that runs the step of the workflow the inputs ask for; its description names the branches.

    A subclass sets ``block_classes``, ``block_names``, ``block_trigger_inputs`` and ``summary`` (what
    the stage does).
    """

    summary = ""

    @property
    def description(self) -> str:
        return f"{self.summary}: {describe_choice(self.block_names, self.block_trigger_inputs)}."


class FamilyBlocks(SequentialPipelineBlocks):
    """A family's whole pipeline: one step (or choice of steps) per stage of ``STAGES``, in that order.

    A subclass sets ``block_classes`` (one per stage) and ``_workflow_map`` (the inputs each named
    workflow needs).
    """

    block_names = list(STAGES)
