"""The manager's link to auto offload: the ``offload.OffloadEngine`` placing its models (one per device), or none."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import offload
from offload import MergedOffloadLog, OffloadEngine, OffloadLog, OffloadRecord, Residency, parse_bytes
from offload.devices.device_choice import (
    DenoiserFirst,
    DeviceChoice,
    DeviceRoom,
    check_choice,
    device_choice_of,
)
from offload.devices.device_list import is_device_list, resolve_devices
from offload.devices.storage import module_nbytes
from offload.host.host_budget import SharedHostBudget, default_host_budget, spill_subfolders

from .model_info import is_bitsandbytes
from .weight_sources import weight_files

__all__ = ["OffloadLink", "cannot_move"]

_Attach = tuple[torch.nn.Module, Sequence[str], bool]  # what attaching one model takes: module, files, pinned


def cannot_move(module: torch.nn.Module) -> bool:
    """Whether auto offload must leave ``module`` where it is: bitsandbytes-quantized weights keep packed
    state the offload engine's moves would lose. A module marked with ``offload.pin`` is pinned by the
    engine itself."""
    return is_bitsandbytes(module)


class OffloadLink:
    """Holds the engine that places a manager's models while auto offload is on, and ``None`` while it is off.

    Given several devices, it holds one engine per device and each model is placed by one of them, chosen
    when it is attached (``offload.devices.device_choice``); plans go to each engine restricted to its models. The
    host budget is one budget split between the engines (``offload.host.host_budget``), shares recomputed as
    models are attached and detached; the spill folder holds one subfolder per device.

    The manager owns one link and tells it what happens to its registry: models are attached as they are
    added and detached as they go, plans of pipeline calls are passed on. Objects that are not a
    ``torch.nn.Module`` are ignored. Not thread safe on its own: the manager calls it with its lock held
    (the engine is thread safe for the hooked calls that run meanwhile).
    """

    def __init__(self) -> None:
        self._engines: list[OffloadEngine] = []  # one per device; empty while off
        self._owner: dict[str, OffloadEngine] = {}  # with several devices: the engine placing each model
        self._choice: DeviceChoice = DenoiserFirst()
        self._host_budget: SharedHostBudget | None = None  # with several devices: the split host budget
        self._spill_made: list[
            str
        ] = []  # with several devices: the spill folders offload made, innermost first
        self._merged: MergedOffloadLog | None = None  # with several devices: the engines' logs read as one
        # With several devices: removes those folders at exit (once empty) if offload is never turned off.
        self._leftovers: weakref.finalize | None = None
        # The peer's offload record, read from the log of the engines last turned on: it outlives disable().
        self.record = OffloadRecord()

    def __repr__(self) -> str:
        if len(self._engines) > 1:
            return f"OffloadLink(engines={self._engines!r})"
        return f"OffloadLink(engine={self._engine!r})"

    @property
    def _engine(self) -> OffloadEngine | None:
        # The one engine of a single device, else None (off, or several devices: route by model).
        return self._engines[0] if len(self._engines) == 1 else None

    @property
    def engine(self) -> OffloadEngine | None:
        """The engine placing the models, or ``None`` when auto offload is off.

        Raises:
            RuntimeError: auto offload runs on several devices, one engine each (read ``engines``). Not the
                first engine: its settings and queries would silently cover one device of several.
        """
        if len(self._engines) > 1:
            names = [engine.probe.name for engine in self._engines]
            msg = (
                f"auto offload runs on {len(names)} devices {names}, one engine each: read offload_engines "
                "(set a setting on each, e.g. `for engine in cm.offload_engines: engine.prefetch = True`; "
                "engine.has_hook(component_id) finds a model's). offload_log holds every engine's decisions."
            )
            raise RuntimeError(msg)
        return self._engine

    @property
    def engines(self) -> list[OffloadEngine]:
        """One engine per device, in the order the devices were given; empty when auto offload is off."""
        return list(self._engines)

    def engine_of(self, component_id: str) -> OffloadEngine | None:
        """The engine placing ``component_id`` (with one device, that device's engine); ``None`` if none."""
        return self._engine if self._engine is not None else self._owner.get(component_id)

    @property
    def enabled(self) -> bool:
        """Whether auto offload is on."""
        return bool(self._engines)

    @property
    def log(self) -> OffloadLog | MergedOffloadLog | None:
        """The engine's log of decisions, or ``None`` when auto offload is off; with several devices, every
        engine's log read as one (``offload.MergedOffloadLog``: the decisions in order, each with its device)."""
        if self._merged is not None:
            return self._merged
        engine = self._engine
        return None if engine is None else engine.log

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

        ``device`` may be a list of devices (``offload.devices.device_list``): one engine each, every model attached
        to the one the device-choice rule picks (``offload.devices.device_choice``), ``host_budget`` split between
        them (``offload.host.host_budget``; a model is then checked against its device's share), and one
        subfolder of ``spill_folder`` per device.

        Raises:
            offload.ModelTooLargeError: a model cannot fit on the device even alone, or the pinned models leave
                no room; nothing changed.
            offload.HostBudgetError: the spill folder is not writable, or a model larger than the host budget
                (with several devices, its device's share) has no file to read it back from; nothing changed.
            ValueError: a device list that is empty, names a device twice or one the machine lacks, or mixes
                simulated and real devices; nothing changed.
        """
        if is_device_list(device):
            options = (memory_reserve_margin, strategy, wait_timeout)
            self._enable_several(components, device, *options, host_budget, spill_folder)
            return
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
        try:
            attaching = self._check_fit(engine, models)
        except BaseException:
            engine.close()  # removes the spill folder it made
            raise
        self._replace_engines({key: engine for key in models}, attaching, undo=engine.close)
        self._engines, self._owner, self._choice = [engine], {}, DenoiserFirst()
        self.record.follow(engine.log)

    def _enable_several(
        self,
        components: Mapping[str, Any],
        devices: Sequence[Any],
        memory_reserve_margin: str | int,
        strategy: Any,
        wait_timeout: float,
        host_budget: str | int | None,
        spill_folder: Any,
    ) -> None:
        """``enable`` for a list of devices: every engine built and every fit checked before the old ones go."""
        whole = (
            default_host_budget(0) if host_budget is None else parse_bytes(host_budget, name="host_budget")
        )
        probes = resolve_devices(devices)
        names = [probe.name for probe in probes]
        root = None if spill_folder is None else os.path.abspath(os.fspath(spill_folder))
        subfolders = spill_subfolders(root, names)
        # Ours to remove once empty: the device subfolders, and the folder itself when offload made it (now,
        # or for the engines this call replaces, whose close would otherwise leave it to nobody).
        made_root = root is not None and (not os.path.isdir(root) or root in self._spill_made)
        made = [folder for folder in subfolders if folder is not None] + (
            [root] if root and made_root else []
        )
        # Made before the engines, so that at exit it runs after their tiers removed their files.
        leftovers = weakref.finalize(self, _remove_empty, made)
        engines: list[OffloadEngine] = []
        try:
            for probe, folder in zip(probes, subfolders):
                engine = offload.OffloadEngine(
                    device=probe,
                    memory_reserve_margin=memory_reserve_margin,
                    strategy=strategy,
                    wait_timeout=wait_timeout,
                    host_budget=whole,  # a share of it each once the models are placed
                    spill_folder=folder,
                )
                engines.append(engine)
            choice = device_choice_of(strategy)
            models = {key: obj for key, obj in components.items() if isinstance(obj, torch.nn.Module)}
            owner = {key: engines[i] for key, i in _choose(choice, engines, models, {}).items()}
            budget = SharedHostBudget(whole, [engine.host_tier for engine in engines], names)
            placed = [
                sum(_host_bytes(module) for key, module in models.items() if owner[key] is engine)
                for engine in engines
            ]
            budget.start(budget.shares(dict(enumerate(placed))))
            attaching: dict[str, _Attach] = {}
            for engine in engines:
                mine = {key: module for key, module in models.items() if owner[key] is engine}
                attaching.update(self._check_fit(engine, mine))
        except BaseException:
            leftovers.detach()
            _close_all(engines, made)
            raise

        def undo() -> None:
            leftovers.detach()
            _close_all(engines, made)

        self._replace_engines(owner, {key: attaching[key] for key in models}, undo)
        self._engines, self._owner, self._choice = engines, owner, choice
        self._host_budget, self._spill_made, self._leftovers = budget, made, leftovers
        self._merged = MergedOffloadLog([engine.log for engine in engines]) if len(engines) > 1 else None
        self.record.follow(self._merged if self._merged is not None else engines[0].log)

    def _check_fit(self, engine: OffloadEngine, models: Mapping[str, torch.nn.Module]) -> dict[str, _Attach]:
        """``engine.check_fit`` of ``models``, before anything changes; returns what attaching each takes: the
        module, its source files (``weight_files``, read once) and whether it is pinned (``cannot_move``)."""
        files = {key: weight_files(module) for key, module in models.items()}
        pinned = [key for key, module in models.items() if cannot_move(module)]
        state = "on with the previous settings" if self._engines else "off"
        engine.check_fit(models, after=f" Auto offload was left {state}.", weight_files=files, pinned=pinned)
        return {key: (module, files[key], key in pinned) for key, module in models.items()}

    def _replace_engines(
        self,
        owner: Mapping[str, OffloadEngine],
        attaching: Mapping[str, _Attach],
        undo: Callable[[], None],
    ) -> None:
        """The checked tail of ``enable``: close the engines in use, then attach each model of ``attaching`` (in
        its order) to its engine in ``owner``; if an attach raises, ``undo`` closes the new engines."""
        self.disable()
        try:
            for component_id, (module, files, pinned) in attaching.items():
                owner[component_id].attach(component_id, module, files, pinned=pinned)
        except BaseException:
            undo()
            raise

    def disable(self) -> None:
        """Closes the engines (hooks removed, weights on their host copies); a no-op when off."""
        engines, self._engines, self._owner = self._engines, [], {}  # off even if close raises DiskCopyError
        self._merged = None
        made, self._host_budget, self._spill_made = self._spill_made, None, []
        if self._leftovers is not None:
            self._leftovers.detach()
            self._leftovers = None
        _close_all(engines, made)

    def attach(self, component_id: str, component: Any) -> None:
        """Hands a newly registered model to the engine (with several devices, the one the device-choice rule
        picks); a no-op when off or for other objects."""
        if not self._engines or not isinstance(component, torch.nn.Module):
            return
        if self._engine is not None:
            attach_to(self._engine, component_id, component)
            return
        index = _choose(self._choice, self._engines, {component_id: component}, self._owner)[component_id]
        assert self._host_budget is not None  # set with the engines of several devices
        placed = _host_bytes(component)  # 0 for a model that stays where it is: nothing to check
        files = weight_files(component)
        modules, checked = ({component_id: component}, {component_id: files}) if placed else ({}, {})
        with self._host_budget.attaching(index, placed, modules, checked):
            attach_to(self._engines[index], component_id, component, files)
        self._owner[component_id] = self._engines[index]

    def detach(self, component_id: str, component: Any) -> None:
        """Takes a model that leaves the registry from its engine; a no-op when off or for other objects.

        Nothing is read back: a model whose host copy is on disk leaves without those weights (meta tensors),
        so a removal never fails on a file gone and never reads a model only to free it.
        """
        engine = self.engine_of(component_id)
        if engine is None or not isinstance(component, torch.nn.Module):
            return
        engine.detach(component_id, read_back=False)
        self._owner.pop(component_id, None)
        if self._host_budget is not None:
            self._host_budget.rebalance()

    def set_plan(self, component_ids: Sequence[str]) -> None:
        """Passes the ids of the models one pipeline call will run, in order, to the engine; a no-op when off.

        With several devices, each engine whose models the call runs gets the plan restricted to them.
        """
        if self._engine is not None:
            self._engine.set_plan(component_ids)
            return
        for engine in self._engines:
            mine = [component_id for component_id in component_ids if self._owner.get(component_id) is engine]
            if mine:
                engine.set_plan(mine)

    def set_strategy(self, strategy: Any, what: str) -> None:
        """Replaces the engine's strategy.

        Raises:
            ValueError: auto offload is off (``what`` names the caller in the message), or the strategy is
                refused (then every engine keeps its strategy).
            offload.ModelTooLargeError: a model cannot fit under the strategy's limit; every engine keeps its
                strategy.
        """
        if not self._engines:
            msg = f"{what} needs auto offload, which is off. Call enable_auto_cpu_offload(...) first."
            raise ValueError(msg)
        done: list[tuple[OffloadEngine, Any]] = []
        try:
            for engine in self._engines:
                previous = engine.strategy
                engine.set_strategy(strategy)
                done.append((engine, previous))
        except (
            Exception
        ):  # one engine refused it (a limit one of its models cannot fit): all keep the old one
            for engine, previous in done:
                engine.set_strategy(previous)
            raise
        if len(self._engines) > 1:  # models added from now on are placed by its rule, if it has one
            self._choice = device_choice_of(strategy)

    def refresh(self, component_id: str, component: Any) -> None:
        """Brings a model's host copy up to date after its weights changed; a no-op when off or for others."""
        engine = self.engine_of(component_id)
        if engine is not None and isinstance(component, torch.nn.Module):
            engine.refresh_host_copy(component_id)

    def residency(self, component_id: str) -> Residency | None:
        """What the engine reports about a component (attached, on the device), or ``None`` when off (or,
        with several devices, when no engine places it)."""
        engine = self.engine_of(component_id)
        return None if engine is None else engine.residency(component_id)

    def places(self, component_id: str) -> bool:
        """Whether the engine places this component now (it carries the engine's hook)."""
        residency = self.residency(component_id)
        return residency is not None and residency.attached


def attach_to(
    engine: OffloadEngine, component_id: str, module: torch.nn.Module, files: Sequence[str] | None = None
) -> None:
    """Attaches ``module`` to ``engine`` with its source files (``files``, read here when not given), pinned
    when it cannot move."""
    files = weight_files(module) if files is None else files
    engine.attach(component_id, module, files, pinned=cannot_move(module))


def _host_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s host copy under the host budget: none for a model that stays where it is."""
    if cannot_move(module) or offload.is_marked_pinned(module):
        return 0
    return module_nbytes(module, count_meta=False)


def _close_all(engines: Sequence[OffloadEngine], made_folders: Sequence[str]) -> None:
    """Close every engine, then remove each of ``made_folders`` (spill folders offload made, innermost
    first) that is left empty; the first error of a close is raised once all are closed."""
    errors = []
    for engine in engines:
        try:
            engine.close()
        except Exception as error:  # every engine closed; the first error said once all are
            errors.append(error)
    _remove_empty(made_folders)
    if errors:
        raise errors[0]


def _remove_empty(folders: Sequence[str]) -> None:
    """Remove each of ``folders`` (innermost first) that is left empty."""
    for folder in folders:
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)


def _choose(
    choice: DeviceChoice,
    engines: Sequence[OffloadEngine],
    models: Mapping[str, torch.nn.Module],
    owner: Mapping[str, OffloadEngine],
) -> dict[str, int]:
    """The index of the engine for each of ``models``, by ``choice``, given the models ``owner`` places."""
    rooms = []
    for index, engine in enumerate(engines):
        total = engine.probe.total_bytes()
        capacity = (engine.probe.free_bytes() if total is None else total) - engine.memory_reserve_margin
        assigned = sum(engine.nbytes(key) for key, placer in owner.items() if placer is engine)
        rooms.append(DeviceRoom(index, engine.probe.name, capacity, assigned))
    chosen = check_choice(choice, {key: module_nbytes(module) for key, module in models.items()}, rooms)
    for key, module in models.items():
        if cannot_move(module) or offload.is_marked_pinned(module):  # stays where it is: that device's engine
            where = next((tensor.device for tensor in module.parameters()), None)
            there = [
                i for i, e in enumerate(engines) if e.probe.moves_weights and e.execution_device == where
            ]
            chosen[key] = there[0] if there else chosen[key]
    return chosen
