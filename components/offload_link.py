"""The manager's link to auto offload: the ``offload.OffloadEngine`` placing its models, or none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

import offload
from offload import OffloadEngine, OffloadLog, Residency

from .model_info import is_bitsandbytes
from .weight_sources import weight_files

__all__ = ["OffloadLink", "cannot_move"]


def cannot_move(module: torch.nn.Module) -> bool:
    """Whether auto offload must leave ``module`` where it is: bitsandbytes-quantized weights keep packed
    state the offload engine's moves would lose. A module marked with ``offload.pin`` is pinned by the
    engine itself."""
    return is_bitsandbytes(module)


class OffloadLink:
    """Holds the engine that places a manager's models while auto offload is on, and ``None`` while it is off.

    The manager owns one link and tells it what happens to its registry: models are attached as they are
    added and detached as they go, plans of pipeline calls are passed on. Objects that are not a
    ``torch.nn.Module`` are ignored. Not thread safe on its own: the manager calls it with its lock held
    (the engine is thread safe for the hooked calls that run meanwhile).
    """

    def __init__(self) -> None:
        self._engine: OffloadEngine | None = None

    def __repr__(self) -> str:
        return f"OffloadLink(engine={self._engine!r})"

    @property
    def engine(self) -> OffloadEngine | None:
        """The engine placing the models, or ``None`` when auto offload is off."""
        return self._engine

    @property
    def enabled(self) -> bool:
        """Whether auto offload is on."""
        return self._engine is not None

    @property
    def log(self) -> OffloadLog | None:
        """The engine's log of decisions, or ``None`` when auto offload is off."""
        return None if self._engine is None else self._engine.log

    def enable(
        self,
        components: Mapping[str, Any],
        device: Any,
        memory_reserve_margin: str | int,
        strategy: Any,
        wait_timeout: float,
        host_budget: str | int | None = None,
        spill_folder: Any = None,
    ) -> None:
        """Builds an engine, attaches every model among ``components`` (``{component id: object}``) to it,
        and puts it in place of the current one (closed first). Arguments as for
        ``ComponentsManager.enable_auto_cpu_offload``.

        Each model's source files (``weight_files``) go with it, so that under a host budget the engine reads
        its unchanged weights back from them. Models that cannot move (``cannot_move``) are attached pinned.

        Raises:
            offload.ModelTooLargeError: a model cannot fit on the device even alone, or the pinned models leave
                no room; nothing changed.
            offload.HostBudgetError: the spill folder is not writable, or a model larger than the host budget
                has no file to read it back from; nothing changed.
        """
        # Looked up on the package when called, so a test can stand in for the engine (test_offload_link.py).
        engine = offload.OffloadEngine(
            device=device,
            memory_reserve_margin=memory_reserve_margin,
            strategy=strategy,
            wait_timeout=wait_timeout,
            host_budget=host_budget,
            spill_folder=spill_folder,
        )
        models = {key: obj for key, obj in components.items() if isinstance(obj, torch.nn.Module)}
        files = {key: weight_files(module) for key, module in models.items()}
        pinned = [key for key, module in models.items() if cannot_move(module)]
        state = "on with the previous settings" if self._engine is not None else "off"
        engine.check_fit(models, after=f" Auto offload was left {state}.", weight_files=files, pinned=pinned)
        self.disable()
        try:
            for component_id, module in models.items():
                engine.attach(component_id, module, files[component_id], pinned=component_id in pinned)
        except BaseException:
            engine.close()
            raise
        self._engine = engine

    def disable(self) -> None:
        """Closes the engine (hooks removed, weights on their host copies); a no-op when off."""
        if self._engine is not None:
            engine, self._engine = self._engine, None  # off even if close raises DiskCopyError (all detached)
            engine.close()

    def attach(self, component_id: str, component: Any) -> None:
        """Hands a newly registered model to the engine; a no-op when off or for other objects."""
        if self._engine is not None and isinstance(component, torch.nn.Module):
            self._engine.attach(
                component_id, component, weight_files(component), pinned=cannot_move(component)
            )

    def detach(self, component_id: str, component: Any) -> None:
        """Takes a model that leaves the registry from the engine; a no-op when off or for other objects."""
        if self._engine is not None and isinstance(component, torch.nn.Module):
            self._engine.detach(component_id)

    def set_plan(self, component_ids: Sequence[str]) -> None:
        """Passes the ids of the models one pipeline call will run, in order, to the engine; a no-op when off."""
        if self._engine is not None:
            self._engine.set_plan(component_ids)

    def set_strategy(self, strategy: Any, what: str) -> None:
        """Replaces the engine's strategy.

        Raises:
            ValueError: auto offload is off (``what`` names the caller in the message).
        """
        if self._engine is None:
            msg = f"{what} needs auto offload, which is off. Call enable_auto_cpu_offload(...) first."
            raise ValueError(msg)
        self._engine.set_strategy(strategy)

    def refresh(self, component_id: str, component: Any) -> None:
        """Brings a model's host copy up to date after its weights changed; a no-op when off or for others."""
        if self._engine is not None and isinstance(component, torch.nn.Module):
            self._engine.refresh_host_copy(component_id)

    def residency(self, component_id: str) -> Residency | None:
        """What the engine reports about a component (attached, on the device), or ``None`` when off."""
        return None if self._engine is None else self._engine.residency(component_id)

    def places(self, component_id: str) -> bool:
        """Whether the engine places this component now (it carries the engine's hook)."""
        residency = self.residency(component_id)
        return residency is not None and residency.attached
