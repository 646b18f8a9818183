"""The manager's methods for auto offload and for changing the models it holds: turning offload on and off,
the plan, reading weights back from the host tier, and the waits between pipeline calls and changes.

``ComponentsManager`` takes them as a base class; they use its lock, registry and ``OffloadLink``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import torch

from offload import MergedOffloadLog, OffloadEngine, OffloadLog, OffloadRecord
from offload.engine.calls import check_wait_timeout

from .model_calls import MODEL_CALLS
from .offload_link import OffloadLink
from .registry import Registry
from .weight_marks import EDITED, mark_modified

__all__ = ["OffloadMethods"]


class OffloadMethods:
    """Auto offload and model changes of a ``ComponentsManager`` (see there)."""

    _lock: threading.RLock
    _wait_timeout: float
    _offload: OffloadLink

    def _locked(self) -> AbstractContextManager[Registry]:
        raise NotImplementedError  # ComponentsManager's: the lock, after releasing what owners dropped

    # ---- calls and changes ----------------------------------------------------------------------------------

    @property
    def wait_timeout(self) -> float:
        """Seconds a change of a model waits for pipeline calls running on it (and a call for a change), and
        auto offload's calls for room; ``enable_auto_cpu_offload(wait_timeout=...)`` sets it too."""
        return self._wait_timeout

    @wait_timeout.setter
    def wait_timeout(self, value: float) -> None:
        self._wait_timeout = check_wait_timeout(value)
        for engine in self._offload.engines:
            engine.wait_timeout = self._wait_timeout

    def changing_models(self, models: Sequence[Any], what: str) -> AbstractContextManager[None]:
        """A context in which ``what`` changes ``models`` (weights or processors) with no pipeline call running
        on them: it waits for running calls in other threads (at most ``wait_timeout`` seconds), and new calls
        wait for it to end (``components.model_calls``).

        Raises (on entering):
            offload.OffloadTimeoutError: calls still ran after ``wait_timeout`` seconds; nothing changed.
            RuntimeError: this thread is inside a pipeline call running on one of ``models``.
        """
        modules = [model for model in models if isinstance(model, torch.nn.Module)]
        return MODEL_CALLS.changing(modules, what, self._wait_timeout)

    # ---- auto offload ---------------------------------------------------------------------------------------

    @property
    def auto_offload_enabled(self) -> bool:
        """Whether auto offload is on."""
        return self._offload.enabled

    @property
    def offload_engine(self) -> OffloadEngine | None:
        """The ``offload.OffloadEngine`` placing this manager's models, or ``None`` when offload is off.

        With several devices it raises ``RuntimeError`` naming ``offload_engines``, one engine per device:
        handing out one of them would apply a setting (``prefetch``, ``memory_reserve_margin``) or answer a
        query for one device of several without a word."""
        return self._offload.engine

    @property
    def offload_engines(self) -> list[OffloadEngine]:
        """One ``offload.OffloadEngine`` per device, in the order given; empty when offload is off."""
        return self._offload.engines

    @property
    def offload_log(self) -> OffloadLog | MergedOffloadLog | None:
        """The engine's ``offload.OffloadLog`` of decisions, or ``None`` when auto offload is off. With several
        devices, one ``offload.MergedOffloadLog`` of every engine's decisions in the order they were made, each
        with its ``device`` (each engine of ``offload_engines`` keeps its own ``log`` too)."""
        return self._offload.log

    @property
    def offload_record(self) -> OffloadRecord:
        """The peer's ``offload_record`` (diffusers' newest manager), read from ``offload_log``: every model
        moved onto or off the device as an ``offload.OffloadEvent`` (``action``, ``model_id``, ``reason``,
        ``available_memory``, ``model_size``), ``summary()``, a bounded ``events`` deque, ``clear()`` (which
        clears ``offload_log`` too: one record) and a table (``print(cm.offload_record)``).

        Kept after ``disable_auto_cpu_offload()`` (it reads the log of the engines that ran) and started
        afresh by ``enable_auto_cpu_offload()``, as the peer's. Never ``None``: empty before offload is on."""
        return self._offload.record

    def is_auto_offloaded(self, component: Any) -> bool:
        """Whether auto offload places ``component`` (the very object): a model registered here while it is on."""
        with self._locked() as registry:
            component_id = registry.id_of(component)
            return component_id is not None and self._offload.places(component_id)

    def enable_auto_cpu_offload(
        self,
        device: Any = None,
        memory_reserve_margin: str | int = "3GB",
        offload_strategy: Any = None,
        wait_timeout: float = 600.0,
        host_budget: str | int | None = None,
        spill_folder: Any = None,
        *,
        memory_reserve: str | int | None = None,
        retry_on_oom: bool = True,
    ) -> None:
        """Turns auto offload on: every model (now and later) is placed by an ``offload.OffloadEngine``.

        Calling it again replaces the engine with one built from the new arguments (after the calls in
        progress return). Pipelines may run in several threads on one manager: a call whose model needs
        room held by models other threads are running waits for them (at most ``wait_timeout`` seconds).

        Args:
            device: Execution device: ``None`` (the default accelerator), ``"cuda:0"``, a ``torch.device`` or
                an ``offload.SimulatedDevice``; or a list of them (``["cuda:0", "cuda:1"]``): one engine per
                device, each model placed by the one ``offload.devices.device_choice`` picks (see docs/offload.md).
            memory_reserve_margin: Memory kept free on the device (``"3GB"`` or bytes).
            memory_reserve: The same, under the name the peer's newest manager gives it (``"3KiB"`` or bytes);
                give one of the two.
            retry_on_oom: A forward that runs out of memory runs again once after every other model left the
                device (the default); ``False`` raises ``offload.OffloadOutOfMemoryError`` at once.
            offload_strategy: An ``offload.OffloadStrategy`` or one written for diffusers' manager (``offload.
                PeerStrategy``); ``None`` for the engine's default.
            wait_timeout: Seconds a call waits for room held by other threads' running models before it
                raises ``offload.OffloadTimeoutError``.
            host_budget, spill_folder: Host memory for host copies (default: what the host has available, less
                a margin) and where changed weights spill; see ``offload.OffloadEngine`` and docs/offload.md.

        Raises:
            offload.ModelTooLargeError: a registered model cannot fit on the device even alone (capacity
                minus margin); auto offload is left as it was.
            offload.HostBudgetError: the spill folder is not writable, or a model larger than host_budget has no
                file to read it back from; auto offload is left as it was.
            ValueError: a device list that is empty, names a device twice or one the machine lacks, or mixes
                simulated and real devices; auto offload is left as it was.
            TypeError: both ``memory_reserve`` and ``memory_reserve_margin``.
        """
        if memory_reserve is not None:
            if memory_reserve_margin != "3GB":
                msg = (
                    "enable_auto_cpu_offload(): memory_reserve and memory_reserve_margin are one setting (the "
                    "peer's newest name and its older one); give one of them"
                )
                raise TypeError(msg)
            memory_reserve_margin = memory_reserve
        with self._locked() as registry:
            components = registry.by_ids(registry.entries)
            options = (memory_reserve_margin, offload_strategy, wait_timeout, host_budget, spill_folder)
            self._offload.enable(components, device, *options)
            for engine in self._offload.engines:
                engine.retry_on_oom = bool(retry_on_oom)
            self._wait_timeout = float(wait_timeout)

    def disable_auto_cpu_offload(self) -> None:
        """Turns auto offload off: hooks removed, weights back on their host copies. A no-op when off.

        Calls in progress in other threads finish first (this waits for them); a pipeline call between
        two model calls goes on without offload.
        """
        with self._lock:
            self._offload.disable()

    def set_offload_strategy(self, strategy: Any) -> None:
        """Replaces the offload strategy; placement and margin stay as they are.

        Raises:
            ValueError: auto offload is off.
        """
        with self._lock:
            self._offload.set_strategy(strategy, "set_offload_strategy()")

    def set_execution_plan(self, components: Sequence[Any]) -> None:
        """Tells the engine the order in which models will run next; a no-op when offload is off.

        Args:
            components: Upcoming component uses of one pipeline call (objects, in order). Objects that are not
                registered models are skipped.
        """
        with self._locked() as registry:
            ids = [registry.id_of(obj) for obj in components if isinstance(obj, torch.nn.Module)]
            self._offload.set_plan([component_id for component_id in ids if component_id is not None])

    @contextmanager
    def host_weights(self, *components: Any) -> Iterator[None]:
        """Inside, these models' weights are in memory, never the placeholders of a host copy dropped under
        ``host_budget``: each one on disk is read back first and kept until the block ends (then the budget
        holds again). For whatever reads or changes weights outside a call: saving, ``named_parameters()``,
        a submodule's ``state_dict()``, an in-place edit (call ``refresh_host_copy`` after it, inside).
        A model's own ``state_dict()`` does this itself. A no-op with offload off.

        Args:
            components: Component ids, or registered objects (others are skipped: offload does not place them).

        Raises:
            ComponentNotFoundError: an id is not registered.
            offload.DiskCopyError: a file a model is read back from is gone or was replaced since.
        """
        with self._locked() as registry:
            held: list[tuple[OffloadEngine, str]] = []
            for component in components:
                component_id = component if isinstance(component, str) else registry.id_of(component)
                if isinstance(component, str) and component not in registry.entries:
                    raise registry.unknown(f"host_weights(): no component has id {component!r}.")
                engine = None if component_id is None else self._offload.engine_of(component_id)
                if engine is not None and component_id is not None:
                    held.append((engine, component_id))
        with ExitStack() as stack:  # outside the manager's lock: each engine takes its own
            for engine, component_id in held:
                stack.enter_context(engine.host_weights(component_id))
            yield

    def refresh_host_copy(self, component_id: str, *, edited: bool = True) -> None:
        """Call after changing a model's weights in place (fusing a LoRA, quantizing) so offload keeps them.

        The model is then marked modified (``components.weight_marks``): its model info and the table say so,
        and it is no longer reused for a load of its load ID. ``edited=False`` refreshes without the mark, for
        a change that leaves the source's weights as they were (an adapter's own layers added or removed).
        """
        with self._locked() as registry:
            if component_id not in registry.entries:
                raise registry.unknown(f"No component has id {component_id!r}.")
            component = registry.entries[component_id].component
            self._offload.refresh(component_id, component)
            if edited:
                mark_modified(component, EDITED, "weights edited in place (refresh_host_copy)")
