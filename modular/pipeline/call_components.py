"""What a pipeline call hands its blocks: the components as seen during the call, and a fresh state."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from diffusers import SchedulerMixin

from modular.framework.state import PipelineState

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["CallComponents", "fresh_state"]


class CallComponents:
    """The pipeline as its blocks see it during one call.

    Schedulers keep per-call state (``set_timesteps`` and ``step`` change them), so each call works on
    its own copy: pipelines that share one scheduler through a manager can run at the same time.
    Everything else is the pipeline's own object.
    """

    def __init__(self, pipeline: ModularPipeline) -> None:
        self._pipeline = pipeline
        self._copies = {
            name: copy.deepcopy(obj)
            for name, obj in pipeline._components.items()
            if isinstance(obj, SchedulerMixin)
        }

    def __getattr__(self, name: str) -> Any:
        copies = self.__dict__["_copies"]
        if name in copies:
            return copies[name]
        return getattr(self.__dict__["_pipeline"], name)


def fresh_state(state: PipelineState | None) -> PipelineState:
    """A state for one call: a copy of ``state`` (the caller's is never changed), or an empty one."""
    fresh = PipelineState()
    if state is not None:
        fresh.values = dict(state.values)
        fresh.kwargs_mapping = {kind: list(keys) for kind, keys in state.kwargs_mapping.items()}
    return fresh
