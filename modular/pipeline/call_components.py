"""What a pipeline call hands its blocks: the components as seen during the call, and a fresh state."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from diffusers import SchedulerMixin

from modular.adapters.call_ip_adapter_scale import end_call_ip_adapter_scale, set_call_ip_adapter_scale
from modular.framework.state import PipelineState

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline
    from modular.watch.watch import CallWatch

__all__ = ["CallComponents", "fresh_state"]


class CallComponents:
    """The pipeline as its blocks see it during one call.

    Schedulers keep per-call state (``set_timesteps`` and ``step`` change them), so each call works on
    its own copy: pipelines that share one scheduler through a manager can run at the same time.
    Everything else is the pipeline's own object.
    """

    def __init__(self, pipeline: ModularPipeline, watch: CallWatch | None = None) -> None:
        self._pipeline = pipeline
        self._call_watch = watch
        self._ip_adapter_scale_token: Any = None
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

    # ----- what a step callback reads and sets (diffusers' callbacks take the pipeline as this view) -----
    @property
    def pipeline(self) -> ModularPipeline:
        """The pipeline this call runs."""
        return self._pipeline

    @property
    def interrupt(self) -> bool:
        """Set by a step callback (``pipeline.interrupt = True``): the call skips its remaining steps."""
        watch = self._call_watch
        return watch is not None and watch.interrupted

    @interrupt.setter
    def interrupt(self, value: bool) -> None:
        if self._call_watch is not None:
            self._call_watch.interrupted = bool(value)

    # The classic pipelines' callbacks set ``pipeline._interrupt``; the peer's set ``pipeline.interrupt``.
    _interrupt = interrupt

    @property
    def _guidance_scale(self) -> float | None:
        """Set by a step callback (``pipeline._guidance_scale = 0.0``, as diffusers' CFG cutoff callbacks do):
        the guidance scale of the call's remaining steps; ``None`` while no callback set one."""
        watch = self._call_watch
        return None if watch is None else watch.guidance_scale

    @_guidance_scale.setter
    def _guidance_scale(self, value: float) -> None:
        if self._call_watch is not None:
            self._call_watch.guidance_scale = value

    def set_ip_adapter_scale(self, scale: Any) -> None:
        """The IP-Adapter scale of the call's remaining steps (diffusers' ``IPAdapterScaleCutoffCallback`` sets 0.0).

        Unlike the classic pipelines, whose change stays after the call, it holds for this call only: the
        denoiser may be shared with other pipelines and threads, whose calls keep the pipeline's scale
        (``modular/adapters/call_ip_adapter_scale.py``). ``pipe.set_ip_adapter_scale`` outside a call sets that.

        Raises:
            IPAdapterError: no IP-Adapter is loaded, or ``scale`` does not fit the loaded adapters.
        """
        self._ip_adapter_scale_token = set_call_ip_adapter_scale(
            self._pipeline, scale, self._ip_adapter_scale_token
        )

    def call_ended(self) -> None:
        """Ends what the call set for itself alone (its IP-Adapter scale)."""
        end_call_ip_adapter_scale(self._ip_adapter_scale_token)
        self._ip_adapter_scale_token = None

    @property
    def num_timesteps(self) -> int | None:
        """The running denoising loop's number of steps (diffusers' callbacks read it)."""
        watch = self._call_watch
        return None if watch is None else watch.num_timesteps


def fresh_state(state: PipelineState | None) -> PipelineState:
    """A state for one call: a copy of ``state`` (the caller's is never changed), or an empty one."""
    fresh = PipelineState()
    if state is not None:
        fresh.values = dict(state.values)
        fresh.kwargs_mapping = {kind: list(keys) for kind, keys in state.kwargs_mapping.items()}
    return fresh
