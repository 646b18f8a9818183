"""ComponentsManager: one registry of loaded components that every pipeline shares."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import torch

from offload import MergedOffloadLog, OffloadEngine, OffloadLog
from offload.calls import check_wait_timeout

from .model_calls import DEFAULT_WAIT_TIMEOUT, MODEL_CALLS
from .model_info import INFO_FIELDS, component_info
from .offload_link import OffloadLink
from .registry import Registry
from .shared_loads import SharedLoads
from .spec import ComponentSpec
from .table import manager_table
from .weight_marks import EDITED, mark_modified

__all__ = ["INFO_FIELDS", "ComponentsManager"]

logger = logging.getLogger(__name__)


class ComponentsManager:
    """A registry of components (models, tokenizers, schedulers) shared by pipelines.

    Components are registered under ids ``"<name>_<id(obj)>"``, optionally in named collections (each holds at
    most one component of a name). Loading through the manager (``get_or_load``) reuses a registered object with
    the same load ID and load options. A registration added with ``owner=`` (a pipeline's from-config components)
    lasts only while an owner lives, so pipelines that are gone leave nothing behind. With auto offload on, every
    model added is placed by the offload engine (through the manager's ``OffloadLink``). All methods are thread
    safe.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._wait_timeout = DEFAULT_WAIT_TIMEOUT  # for changes of models and the calls they wait for
        self._offload = OffloadLink()  # the engine placing the models while auto offload is on
        self._registry = Registry(on_add=self._offload.attach, on_remove=self._offload.detach)
        self._loads = SharedLoads(
            self._lock, self._locked, self._registry
        )  # get_or_load: reuse, or load once

    @contextmanager
    def _locked(self) -> Iterator[Registry]:
        """The lock, after dropping registrations whose owners are gone: every public method enters here."""
        with self._lock:
            self._registry.release_collected()
            yield self._registry

    # ---- registry -------------------------------------------------------------------------------------------

    @property
    def components(self) -> dict[str, Any]:
        """A snapshot ``{component id: object}``, in registration order."""
        with self._locked() as registry:
            return registry.by_ids(registry.entries)

    @property
    def collections(self) -> dict[str, list[str]]:
        """A snapshot ``{collection: [component ids]}``."""
        with self._locked() as registry:
            return {name: list(members.values()) for name, members in registry.collections.items()}

    def __len__(self) -> int:
        with self._locked() as registry:
            return len(registry.entries)

    def __contains__(self, component_id: object) -> bool:
        with self._locked() as registry:
            return component_id in registry.entries

    def get_id(self, component: Any) -> str | None:
        """The id ``component`` (the very object) is registered under, or ``None``."""
        with self._locked() as registry:
            return registry.id_of(component)

    def add(self, name: str, component: Any, collection: str | None = None, *, owner: Any = None) -> str:
        """Registers ``component`` under ``"<name>_<id(component)>"`` and returns that id.

        Adding the same object again returns its id (and adds it to ``collection``). A collection holds one
        component per name: an older one of that name leaves the collection, and the manager too when it is in
        no other collection. With auto offload on, a ``torch.nn.Module`` is attached to the offload engine.

        With ``owner`` (an object that supports weak references, e.g. the pipeline that made the component),
        the registration lasts while an owner lives: it is removed once every owner it was added with has been
        garbage-collected. Adding the object again with another owner adds an owner; adding it without one keeps
        it until it is removed, as a registration without owner always is.

        Raises:
            ValueError: ``name`` is not an identifier, or the object is registered under another name.
            TypeError: ``owner`` does not support weak references.
        """
        with self._locked() as registry:
            return registry.add(name, component, collection, None, owner)

    def remove(self, component_id: str) -> None:
        """Unregisters a component (and detaches it from auto offload). The manager keeps no reference to it.

        It first waits for pipeline calls running on it in other threads (``changing_models``). Nothing is read
        back: a model whose host copy was dropped under ``host_budget`` leaves without those weights (meta
        tensors: no memory, and any use fails loudly instead of computing on placeholders), so removing never
        fails on a file gone since. To keep using the object afterwards, remove it inside
        ``with manager.host_weights(component_id):``, which reads it back first.

        Raises:
            ComponentNotFoundError: no component has this id.
            offload.OffloadTimeoutError: calls still ran after ``wait_timeout`` seconds; nothing was removed.
            RuntimeError: called from inside a pipeline call running on it in this thread.
        """
        with self._locked() as registry:
            if component_id not in registry.entries:
                raise registry.unknown(f"Cannot remove {component_id!r}: no component has this id.")
            component = registry.entries[component_id].component
        # Outside the lock: the calls it waits for may need the manager meanwhile.
        with self.changing_models([component], f"remove({component_id!r})"):
            with self._locked() as registry:
                if component_id not in registry.entries:  # removed by another thread meanwhile
                    raise registry.unknown(f"Cannot remove {component_id!r}: no component has this id.")
                registry.remove(component_id)

    def remove_from_collection(self, component_id: str, collection: str) -> None:
        """Takes a component out of a collection; removes it from the manager when no collection holds it.

        Raises:
            ComponentNotFoundError: the collection does not exist or does not hold the component.
        """
        with self._locked() as registry:
            registry.remove_from_collection(component_id, collection)

    # ---- loading --------------------------------------------------------------------------------------------

    def get_or_load(self, spec: ComponentSpec, collection: str | None = None, **load_options: Any) -> Any:
        """Returns a registered component for ``spec``, loading and registering it only when none fits.

        A registered object fits when its load ID equals the spec's (after the loading-field overrides in
        ``load_options``) and it was loaded with the same dtype and quantization. Otherwise
        ``spec.load(**load_options)`` runs and the result is added under ``spec.name``. Two threads asking for
        the same thing load it once. A ``from_config`` spec is created fresh each time. A failed load
        registers nothing.

        Args:
            spec: What to get.
            collection: Collection to put the component in (also when it is reused).
            **load_options: As for ``ComponentSpec.load``.

        Raises:
            TypeError: an unknown keyword (``components.load_kwargs.split_load_kwargs``).
        """
        if spec.default_creation_method == "from_config":
            component = spec.create()
            self.add(spec.name, component, collection)
            return component
        return self._loads.get_or_load(spec, collection, load_options)

    # ---- look-ups -------------------------------------------------------------------------------------------

    def search_components(
        self,
        names: str | None = None,
        collection: str | None = None,
        load_id: str | None = None,
        return_dict_with_names: bool = True,
    ) -> dict[str, Any]:
        """Finds components by name pattern, collection and load ID.

        Patterns: ``unet`` (exact), ``unet|vae`` (either), ``!unet`` (all but), ``text*`` (prefix), ``*coder``
        (suffix), ``*enc*`` (contains).

        Returns:
            ``{name: object}``, or ``{component id: object}`` with ``return_dict_with_names=False``.

        Raises:
            ComponentNotFoundError: a pattern, collection or load ID was given and nothing matches.
            ValueError: two matches share a name while ``return_dict_with_names`` is True.
        """
        with self._locked() as registry:
            ids = registry.select(names, collection, load_id)
            if not ids and (names, collection, load_id) != (None, None, None):
                raise registry.unknown(
                    f"No component matches pattern {names!r} (collection {collection!r}, load_id {load_id!r})."
                )
            if not return_dict_with_names:
                return registry.by_ids(ids)
            return registry.by_names(ids, "pass collection=... or return_dict_with_names=False.")

    def get_one(
        self,
        component_id: str | None = None,
        name: str | None = None,
        collection: str | None = None,
        load_id: str | None = None,
    ) -> Any:
        """Returns exactly one component, by id or by name pattern / collection / load ID.

        Raises:
            ValueError: ``component_id`` combined with other filters, or several components match.
            ComponentNotFoundError: nothing matches (the message lists what is registered).
        """
        with self._locked() as registry:
            if component_id is not None:
                if (name, collection, load_id) != (None, None, None):
                    msg = "get_one(): pass either component_id or name/collection/load_id, not both."
                    raise ValueError(msg)
                if component_id not in registry.entries:
                    raise registry.unknown(f"No component has id {component_id!r}.")
                return registry.entries[component_id].component
            ids = registry.select(name, collection, load_id)
            if not ids:
                raise registry.unknown(
                    f"No component matches name {name!r}, collection {collection!r}, load_id {load_id!r}."
                )
            if len(ids) > 1:
                msg = (
                    f"{len(ids)} components match name {name!r}, collection {collection!r}, load_id {load_id!r}: "
                    f"{ids}. Narrow it with collection=/load_id=, or pass component_id=."
                )
                raise ValueError(msg)
            return registry.entries[ids[0]].component

    def get_ids(self, names: str | Sequence[str] | None = None, collection: str | None = None) -> list[str]:
        """Ids of the components with these exact names (all when ``None``), optionally in one collection."""
        with self._locked() as registry:
            return registry.ids_named([names] if isinstance(names, str) else names, collection)

    def get_components_by_ids(
        self, ids: Sequence[str], return_dict_with_names: bool = True
    ) -> dict[str, Any]:
        """``{name: object}`` (or ``{id: object}``) for these ids.

        Raises:
            ComponentNotFoundError: an id is not registered.
        """
        with self._locked() as registry:
            missing = [component_id for component_id in ids if component_id not in registry.entries]
            if missing:
                raise registry.unknown(f"Unknown component id(s) {missing}.")
            if not return_dict_with_names:
                return registry.by_ids(ids)
            return registry.by_names(ids, "pass return_dict_with_names=False.")

    def get_components_by_names(self, names: Sequence[str], collection: str | None = None) -> dict[str, Any]:
        """``{name: object}`` for the registered ones among ``names``: ready for ``update_components(**d)``."""
        with self._locked() as registry:
            return registry.by_names(registry.ids_named(names, collection), "pass collection=... to choose.")

    # ---- information ----------------------------------------------------------------------------------------

    def get_model_info(self, component_id: str, fields: str | Sequence[str] | None = None) -> dict[str, Any]:
        """Facts about one component; model-only fields are ``None`` for other components.

        Fields: ``model_id, added_time, collection, class_name, size_gb`` (unique storage bytes), ``device,
        dtype, load_id, adapters`` (peft adapter names), ``lora`` (per LoRA adapter: active, weight, fused,
        loaded by), ``has_hook, execution_device, ip_adapter, quantization, resident_share, pinned``, and
        ``modified``: how its weights differ from its load ID's (a fused LoRA, an edit), or ``None``.

        Raises:
            ComponentNotFoundError: unknown id.
            ValueError: an unknown field.
        """
        wanted = (
            [fields] if isinstance(fields, str) else list(fields) if fields is not None else list(INFO_FIELDS)
        )
        unknown = [field for field in wanted if field not in INFO_FIELDS]
        if unknown:
            msg = f"get_model_info(): unknown field(s) {unknown}; available: {list(INFO_FIELDS)}."
            raise ValueError(msg)
        with self._locked() as registry:
            entry = registry.entries.get(component_id)
            if entry is None:
                raise registry.unknown(f"No component has id {component_id!r}.")
            collections = registry.collections_of(component_id)
            residency = self._offload.residency(component_id)
        info = component_info(component_id, entry.component, entry.added_time, collections, residency)
        return {field: info[field] for field in wanted}

    def __repr__(self) -> str:
        with self._locked():
            return manager_table(self, self._offload.residency)

    __str__ = __repr__

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
    ) -> None:
        """Turns auto offload on: every model (now and later) is placed by an ``offload.OffloadEngine``.

        Calling it again replaces the engine with one built from the new arguments (after the calls in
        progress return). Pipelines may run in several threads on one manager: a call whose model needs
        room held by models other threads are running waits for them (at most ``wait_timeout`` seconds).

        Args:
            device: Execution device: ``None`` (the default accelerator), ``"cuda:0"``, a ``torch.device`` or
                an ``offload.SimulatedDevice``; or a list of them (``["cuda:0", "cuda:1"]``): one engine per
                device, each model placed by the one ``offload.device_choice`` picks (see docs/offload.md).
            memory_reserve_margin: Memory kept free on the device (``"3GB"`` or bytes).
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
        """
        with self._locked() as registry:
            components = registry.by_ids(registry.entries)
            options = (memory_reserve_margin, offload_strategy, wait_timeout, host_budget, spill_folder)
            self._offload.enable(components, device, *options)
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

    # ---- classic pipelines ----------------------------------------------------------------------------------

    def components_for(self, pipeline_class: type, collection: str | None = None) -> dict[str, Any]:
        """The keyword arguments of a classic diffusers pipeline class, from the components held here.

        ``FluxPipeline(**cm.components_for(FluxPipeline))`` builds the classic pipeline on the manager's
        components (with auto offload on, they stay placed by it). Parameters match components by name, in
        ``collection`` when given; see ``components.classic.classic_pipeline_kwargs`` for the rules.

        Raises:
            ValueError: several components of one name are in scope (pass ``collection=``).
            ComponentNotFoundError: a required component is not held.
        """
        from .classic import classic_pipeline_kwargs

        return classic_pipeline_kwargs(self, pipeline_class, collection)
