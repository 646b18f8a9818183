"""The manager's switch for auto offload: thin delegation to ``offload.OffloadEngine``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

__all__ = ["OffloadSwitch"]


class OffloadSwitch:
    """Auto-offload methods of ``ComponentsManager``; the engine itself lives in offload/.

    The manager provides ``_lock``, ``_entries`` (id -> entry with ``.component``), ``_engine``, ``get_id``
    and ``_unknown``; ``add``/``remove`` attach and detach models while an engine is set.
    """

    _lock: threading.RLock
    _entries: dict[str, Any]
    _engine: Any

    if TYPE_CHECKING:  # provided by the manager; declared here for the type checker only

        def get_id(self, component: Any) -> str | None: ...

        def _unknown(self, what: str) -> KeyError: ...

    @property
    def auto_offload_enabled(self) -> bool:
        """Whether auto offload is on."""
        return self._engine is not None

    @property
    def offload_engine(self) -> Any:
        """The ``offload.OffloadEngine`` placing this manager's models, or ``None`` when offload is off."""
        return self._engine

    def enable_auto_cpu_offload(
        self,
        device: Any = None,
        memory_reserve_margin: str | int = "3GB",
        offload_strategy: Any = None,
        wait_timeout: float = 600.0,
    ) -> None:
        """Turns auto offload on: every model (now and later) is placed by an ``offload.OffloadEngine``.

        Calling it again replaces the engine with one built from the new arguments (after the calls in
        progress return). Pipelines may run in several threads on one manager: a call whose model needs
        room held by models other threads are running waits for them (at most ``wait_timeout`` seconds).

        Args:
            device: Execution device: ``None`` (the default accelerator), ``"cuda:0"``, a ``torch.device`` or
                an ``offload.SimulatedDevice``.
            memory_reserve_margin: Memory kept free on the device (``"3GB"`` or bytes).
            offload_strategy: An ``offload.OffloadStrategy``; ``None`` for the engine's default.
            wait_timeout: Seconds a call waits for room held by other threads' running models before it
                raises ``offload.OffloadTimeoutError``.

        Raises:
            offload.ModelTooLargeError: a registered model cannot fit on the device even alone (capacity
                minus margin); auto offload is left as it was.
        """
        from offload import OffloadEngine  # lazily: offload/ is optional until auto offload is used

        engine = OffloadEngine(
            device=device,
            memory_reserve_margin=memory_reserve_margin,
            strategy=offload_strategy,
            wait_timeout=wait_timeout,
        )
        with self._lock:
            models = {
                component_id: entry.component
                for component_id, entry in self._entries.items()
                if isinstance(entry.component, torch.nn.Module)
            }
            state = "on with the previous settings" if self._engine is not None else "off"
            engine.check_fit(models, after=f" Auto offload was left {state}.")
            self.disable_auto_cpu_offload()
            try:
                for component_id, module in models.items():
                    engine.attach(component_id, module)
            except BaseException:
                engine.close()
                raise
            self._engine = engine

    def disable_auto_cpu_offload(self) -> None:
        """Turns auto offload off: hooks removed, weights back on their host copies. A no-op when off.

        Calls in progress in other threads finish first (this waits for them); a pipeline call between
        two model calls goes on without offload.
        """
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def _require_engine(self, what: str) -> Any:
        if self._engine is None:
            msg = f"{what} needs auto offload, which is off. Call enable_auto_cpu_offload(...) first."
            raise ValueError(msg)
        return self._engine

    def set_offload_strategy(self, strategy: Any) -> None:
        """Replaces the offload strategy; placement and margin stay as they are.

        Raises:
            ValueError: auto offload is off.
        """
        self._require_engine("set_offload_strategy()").set_strategy(strategy)

    @property
    def offload_log(self) -> Any:
        """The engine's ``offload.OffloadLog`` of decisions, or ``None`` when auto offload is off."""
        return None if self._engine is None else self._engine.log

    def set_execution_plan(self, components: Sequence[Any]) -> None:
        """Tells the engine the order in which models will run next; a no-op when offload is off.

        Args:
            components: Upcoming component uses of one pipeline call (objects, in order). Objects that are not
                registered models are skipped.
        """
        with self._lock:
            if self._engine is None:
                return
            ids = [self.get_id(obj) for obj in components if isinstance(obj, torch.nn.Module)]
            self._engine.set_plan([component_id for component_id in ids if component_id is not None])

    def refresh_host_copy(self, component_id: str) -> None:
        """Call after changing a model's weights in place (fusing a LoRA, quantizing) so offload keeps them."""
        with self._lock:
            if component_id not in self._entries:
                raise self._unknown(f"No component has id {component_id!r}.")
            if self._engine is not None and isinstance(
                self._entries[component_id].component, torch.nn.Module
            ):
                self._engine.refresh_host_copy(component_id)
