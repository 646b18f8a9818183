"""What the scheduler tells the offload engines, knowing its queue: which calls come next, and what to bring up.

Both are hints: they change which models move and when, never a result. ``expect`` tells each engine the
calls after the running one (``OffloadEngine.expect_calls``): right after a switch of families, the engine's
history is the old family's, and without the hint its strategy would evict the new family's models for the
old one's. ``prefetch`` loads the next job's pipeline to the host while a job runs and places its models
where the device has free room (``OffloadEngine.place_if_room``: it never evicts, so the running job loses
nothing to it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from components import ComponentsManager
from modular.serving.served import ServedWorkflows

__all__ = ["EngineHints"]

log = logging.getLogger(__name__)


class EngineHints:
    """The hints of one scheduler to the engines of its manager (none when auto offload is off)."""

    def __init__(self, served: ServedWorkflows) -> None:
        self.served = served
        self.manager: ComponentsManager = served.manager

    def model_ids(self, workflow: str) -> tuple[str, ...]:
        """The manager ids of ``workflow``'s loaded models (none before its pipeline loads)."""
        if not self.served.is_loaded(workflow):
            return ()
        pipe = self.served.pipeline(workflow)
        modules = (getattr(pipe, name, None) for name in pipe.component_names)
        ids = (self.manager.get_id(module) for module in modules if isinstance(module, torch.nn.Module))
        return tuple(component_id for component_id in ids if component_id is not None)

    def expect(self, workflow: str, images: int, upcoming: Sequence[str]) -> None:
        """Before a job of ``workflow`` making ``images`` images runs: its other images (or, for one image, its
        workflow once more: with nothing waiting, the cheapest next job is one of its workflow), then the
        ``upcoming`` workflows' jobs, in the order they would run."""
        engines = self.manager.offload_engines
        if not engines:
            return
        plans = [self.model_ids(workflow)] * max(1, images - 1)
        plans += [self.model_ids(name) for name in upcoming]
        for engine in engines:
            engine.expect_calls([[m for m in plan if engine.has_hook(m)] for plan in plans if plan])

    def clear(self) -> None:
        """After the job: the engines learn from their own history again (calls made outside the queue)."""
        for engine in self.manager.offload_engines:
            engine.expect_calls(())

    def prefetch(self, workflow: str, on_cuda: bool) -> None:
        """Load ``workflow``'s pipeline to the host, and place its models where the device has free room now."""
        try:
            self.served.load(workflow, on_cuda)
            for component_id in self.model_ids(workflow):
                for engine in self.manager.offload_engines:
                    if engine.has_hook(component_id):
                        engine.place_if_room(component_id)
        except Exception as error:  # a prefetch is a hint: the job itself meets (and reports) any problem
            log.info("prefetch of %s stopped: %s: %s", workflow, type(error).__name__, error)
