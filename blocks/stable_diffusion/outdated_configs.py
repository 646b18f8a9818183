"""The classic Stable Diffusion pipelines' fixes for outdated repo configs, applied as they apply them.

Constructing ``StableDiffusionPipeline`` or ``StableDiffusionImg2ImgPipeline`` rewrites a scheduler config whose
``steps_offset`` is not 1 (to 1) and whose ``clip_sample`` is true (to false); ``StableDiffusionInpaintPipeline``
rewrites ``steps_offset`` and a ``skip_prk_steps`` of false (to true), and leaves ``clip_sample``. Each fix
warns (``FutureWarning``). Old SD repos on the hub ship such configs, so without the same fixes our images would
differ from the classic pipeline's on the same repo.

The fixes differ by workflow, and one of our pipelines serves all three: each workflow's timesteps step applies
its classic pipeline's scheduler fixes to the call's own copy of the scheduler (``CallComponents``), before the
scheduler is first used. The pipeline's scheduler, shared through the manager and saved by ``save_pretrained``,
keeps the config the repo wrote. (The classic pipelines' third fix, a pre-0.9 UNet's ``sample_size`` below 64,
is not applied: it changes only the default size, and a call can pass height and width.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import attrs

__all__ = [
    "INPAINT_SCHEDULER_FIXES",
    "SchedulerFix",
    "TEXT2IMAGE_SCHEDULER_FIXES",
    "fix_outdated_scheduler",
]


@attrs.frozen
class SchedulerFix:
    """One scheduler config key a classic pipeline rewrites: when `outdated(value)` (the value, or `missing` when
    the config lacks the key), the call's scheduler gets `fixed`."""

    key: str
    missing: Any
    outdated: Callable[[Any], bool]
    fixed: Any


_STEPS_OFFSET = SchedulerFix("steps_offset", 1, lambda value: value != 1, 1)
#: StableDiffusionPipeline's and StableDiffusionImg2ImgPipeline's fixes.
TEXT2IMAGE_SCHEDULER_FIXES = (
    _STEPS_OFFSET,
    SchedulerFix("clip_sample", False, lambda value: value is True, False),
)
#: StableDiffusionInpaintPipeline's fixes.
INPAINT_SCHEDULER_FIXES = (
    _STEPS_OFFSET,
    SchedulerFix("skip_prk_steps", True, lambda value: value is False, True),
)


def fix_outdated_scheduler(scheduler: Any, fixes: tuple[SchedulerFix, ...], classic: str) -> None:
    """Rewrite the outdated keys of `scheduler`'s config (the call's copy) as the `classic` pipeline does, with a
    FutureWarning per key that names the value found, the value used and how to update the repo."""
    config = scheduler.config
    changes = {}
    for fix in fixes:
        value = config.get(fix.key, fix.missing)
        if fix.outdated(value):
            changes[fix.key] = fix.fixed
            msg = (
                f"The scheduler config ({type(scheduler).__name__}) sets {fix.key}={value!r}, which is outdated; "
                f'using {fix.key}={fix.fixed!r} as diffusers\' {classic} does. Set "{fix.key}": '
                f"{str(fix.fixed).lower()} in the repo's scheduler/scheduler_config.json to silence this."
            )
            warnings.warn(msg, FutureWarning, stacklevel=3)
    if changes:
        scheduler.register_to_config(**changes)
