"""ComponentsManager: one registry of loaded components that every pipeline shares."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import torch

from .errors import ComponentNotFoundError
from .load_id import LOAD_ID_FIELDS, get_load_id
from .model_info import INFO_FIELDS, component_info
from .offload_switch import OffloadSwitch
from .reuse import LoadOptions
from .search import compile_pattern
from .spec import ComponentSpec
from .table import manager_table

__all__ = ["INFO_FIELDS", "ComponentsManager"]

logger = logging.getLogger(__name__)


_serials = itertools.count()


@attrs.define
class _Entry:
    component: Any
    name: str
    added_time: float
    options: LoadOptions
    # How many owners (with their finalizers) still hold this registration; None: kept until removed.
    owners: int | None = None
    # Tells a late finalizer of a removed registration from one of a new registration under the same id.
    serial: int = attrs.field(factory=lambda: next(_serials))


def _release_later(manager_ref: weakref.ref[ComponentsManager], component_id: str, serial: int) -> None:
    # Runs from the garbage collector, at any allocation, in any thread, perhaps while this very thread is
    # iterating the registry or holding the offload engine's lock: so it only queues (deque.append is atomic)
    # and the manager drains the queue at its next public call. Test: test_owner_finalizer_only_queues.
    manager = manager_ref()
    if manager is not None:
        manager._released.append((component_id, serial))


def _check_owner(name: str, owner: Any) -> None:
    try:
        weakref.ref(owner)
    except TypeError:
        msg = (
            f"Cannot add {name!r} with owner={type(owner).__name__}: an owner must support weak references "
            "(the registration is dropped when the owner is garbage-collected)."
        )
        raise TypeError(msg) from None


class ComponentsManager(OffloadSwitch):
    """A registry of components (models, tokenizers, schedulers) shared by pipelines.

    Components are registered under ids ``"<name>_<id(obj)>"``, optionally in named collections (each holds at
    most one component of a name). Loading through the manager (``get_or_load``) reuses a registered object with
    the same load ID and load options. A registration added with ``owner=`` (a pipeline's from-config components)
    lasts only while an owner lives, so pipelines that are gone leave nothing behind. With auto offload on, every
    model added is placed by the offload engine. All methods are thread safe.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._collections: dict[str, dict[str, str]] = {}  # collection -> {name: component id}
        self._lock = threading.RLock()
        self._loading: dict[tuple[str, LoadOptions], threading.Lock] = {}
        self._engine: Any = None
        self._released: deque[tuple[str, int]] = deque()  # (id, serial) whose owner was garbage-collected

    @contextmanager
    def _registry(self) -> Iterator[None]:
        """The lock, after dropping registrations whose owners are gone: every public method enters here."""
        with self._lock:
            while self._released:
                component_id, serial = self._released.popleft()
                entry = self._entries.get(component_id)
                if entry is None or entry.serial != serial or entry.owners is None:
                    continue  # removed, replaced or made permanent since
                entry.owners -= 1
                if entry.owners == 0:
                    logger.info("Releasing %s: its owners are gone", component_id)
                    self._remove(component_id)
            yield

    # ---- registry -------------------------------------------------------------------------------------------

    @property
    def components(self) -> dict[str, Any]:
        """A snapshot ``{component id: object}``, in registration order."""
        with self._registry():
            return {component_id: entry.component for component_id, entry in self._entries.items()}

    @property
    def collections(self) -> dict[str, list[str]]:
        """A snapshot ``{collection: [component ids]}``."""
        with self._registry():
            return {name: list(members.values()) for name, members in self._collections.items()}

    def __len__(self) -> int:
        with self._registry():
            return len(self._entries)

    def __contains__(self, component_id: object) -> bool:
        with self._registry():
            return component_id in self._entries

    def _unknown(self, what: str) -> ComponentNotFoundError:
        ids = list(self._entries) or "none"
        return ComponentNotFoundError(f"{what} Registered components: {ids}.")

    def get_id(self, component: Any) -> str | None:
        """The id ``component`` (the very object) is registered under, or ``None``."""
        with self._registry():
            return self._id_of(component)

    def _id_of(self, component: Any) -> str | None:
        for component_id, entry in self._entries.items():
            if entry.component is component:
                return component_id
        return None

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
        return self._add(name, component, collection, None, owner)

    def _add(
        self,
        name: str,
        component: Any,
        collection: str | None,
        options: LoadOptions | None,
        owner: Any = None,
    ) -> str:
        if not isinstance(name, str) or not name.isidentifier():
            msg = f"Component name must be a Python identifier such as 'unet' (got {name!r})."
            raise ValueError(msg)
        if owner is not None:
            _check_owner(name, owner)
        with self._registry():
            component_id = self._id_of(component)
            if component_id is not None and self._entries[component_id].name != name:
                msg = (
                    f"Cannot add {type(component).__name__} as {name!r}: the same object is registered as "
                    f"{component_id!r}, and an object has one name in a manager. Use that id, or remove it first."
                )
                raise ValueError(msg)
            if component_id is None:
                component_id = f"{name}_{id(component)}"
                if self._engine is not None and isinstance(component, torch.nn.Module):
                    self._engine.attach(component_id, component)
                options = options or LoadOptions.from_object(component)
                self._entries[component_id] = _Entry(
                    component, name, time.time(), options, owners=0 if owner is not None else None
                )
                logger.info("Added component %s", component_id)
            entry = self._entries[component_id]
            if owner is None:
                entry.owners = None
            elif entry.owners is not None:
                entry.owners += 1
                finalizer = weakref.finalize(
                    owner, _release_later, weakref.ref(self), component_id, entry.serial
                )
                finalizer.atexit = False
            if collection is not None:
                self._put_in_collection(component_id, name, collection)
            return component_id

    def _put_in_collection(self, component_id: str, name: str, collection: str) -> None:
        members = self._collections.setdefault(collection, {})
        previous = members.get(name)
        members[name] = component_id
        if previous is not None and previous != component_id:
            logger.info("Collection %r: %s replaces %s", collection, component_id, previous)
            if not any(previous in other.values() for other in self._collections.values()):
                self._remove(previous)

    def remove(self, component_id: str) -> None:
        """Unregisters a component (and detaches it from auto offload). The manager keeps no reference to it.

        Raises:
            ComponentNotFoundError: no component has this id.
        """
        with self._registry():
            if component_id not in self._entries:
                raise self._unknown(f"Cannot remove {component_id!r}: no component has this id.")
            self._remove(component_id)

    def _remove(self, component_id: str) -> None:
        entry = self._entries[component_id]
        if self._engine is not None and isinstance(entry.component, torch.nn.Module):
            self._engine.detach(component_id)
        del self._entries[component_id]
        for collection, members in list(self._collections.items()):
            for name, member in list(members.items()):
                if member == component_id:
                    del members[name]
            if not members:
                del self._collections[collection]
        logger.info("Removed component %s", component_id)

    def remove_from_collection(self, component_id: str, collection: str) -> None:
        """Takes a component out of a collection; removes it from the manager when no collection holds it.

        Raises:
            ComponentNotFoundError: the collection does not exist or does not hold the component.
        """
        with self._registry():
            members = self._collections.get(collection)
            if members is None or component_id not in members.values():
                held = list(members.values()) if members else []
                msg = (
                    f"Collection {collection!r} does not hold {component_id!r} (it holds {held}; collections: "
                    f"{list(self._collections)})."
                )
                raise ComponentNotFoundError(msg)
            for name, member in list(members.items()):
                if member == component_id:
                    del members[name]
            if not members:
                del self._collections[collection]
            if not any(component_id in other.values() for other in self._collections.values()):
                self._remove(component_id)

    # ---- loading --------------------------------------------------------------------------------------------

    def _find_reusable(self, load_id: str, options: LoadOptions) -> str | None:
        for component_id, entry in self._entries.items():
            if get_load_id(entry.component) == load_id and entry.options.serves(options, entry.component):
                return component_id
        return None

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
        """
        if spec.default_creation_method == "from_config":
            component = spec.create()
            self.add(spec.name, component, collection)
            return component
        overrides = {key: load_options[key] for key in LOAD_ID_FIELDS if key in load_options}
        if "repo" in load_options:
            overrides["pretrained_model_name_or_path"] = load_options["repo"]
        load_id = attrs.evolve(spec, **overrides).load_id
        options = LoadOptions.from_request(load_options)
        key = (load_id, options)
        with self._registry():
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                found = self._find_reusable(load_id, options)
                if found is not None:
                    entry = self._entries[found]
                    if collection is not None:
                        self._put_in_collection(found, entry.name, collection)
                    logger.info("Reusing %s for %s", found, load_id)
                    return entry.component
            try:
                # Outside the registry lock: other work goes on meanwhile.
                component = spec.load(**load_options)
                self._add(spec.name, component, collection, options)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            return component

    # ---- look-ups -------------------------------------------------------------------------------------------

    def _select(self, names: str | None, collection: str | None, load_id: str | None) -> list[str]:
        predicate = compile_pattern(names) if names is not None else None
        members = set(self._collections.get(collection, {}).values()) if collection is not None else None
        return [
            component_id
            for component_id, entry in self._entries.items()
            if (predicate is None or predicate(entry.name))
            and (members is None or component_id in members)
            and (load_id is None or get_load_id(entry.component) == load_id)
        ]

    def _by_names(self, ids: Iterable[str], hint: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for component_id in ids:
            entry = self._entries[component_id]
            if entry.name in result:
                same = [i for i in ids if self._entries[i].name == entry.name]
                msg = f"Several components are named {entry.name!r} ({same}); {hint}"
                raise ValueError(msg)
            result[entry.name] = entry.component
        return result

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
        with self._registry():
            ids = self._select(names, collection, load_id)
            if not ids and (names, collection, load_id) != (None, None, None):
                raise self._unknown(
                    f"No component matches pattern {names!r} (collection {collection!r}, load_id {load_id!r})."
                )
            if not return_dict_with_names:
                return {component_id: self._entries[component_id].component for component_id in ids}
            return self._by_names(ids, "pass collection=... or return_dict_with_names=False.")

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
        with self._registry():
            if component_id is not None:
                if (name, collection, load_id) != (None, None, None):
                    msg = "get_one(): pass either component_id or name/collection/load_id, not both."
                    raise ValueError(msg)
                if component_id not in self._entries:
                    raise self._unknown(f"No component has id {component_id!r}.")
                return self._entries[component_id].component
            ids = self._select(name, collection, load_id)
            if not ids:
                raise self._unknown(
                    f"No component matches name {name!r}, collection {collection!r}, load_id {load_id!r}."
                )
            if len(ids) > 1:
                msg = (
                    f"{len(ids)} components match name {name!r}, collection {collection!r}, load_id {load_id!r}: "
                    f"{ids}. Narrow it with collection=/load_id=, or pass component_id=."
                )
                raise ValueError(msg)
            return self._entries[ids[0]].component

    def get_ids(self, names: str | Sequence[str] | None = None, collection: str | None = None) -> list[str]:
        """Ids of the components with these exact names (all when ``None``), optionally in one collection."""
        wanted = [names] if isinstance(names, str) else names
        with self._registry():
            members = set(self._collections.get(collection, {}).values()) if collection is not None else None
            return [
                component_id
                for component_id, entry in self._entries.items()
                if (wanted is None or entry.name in wanted) and (members is None or component_id in members)
            ]

    def get_components_by_ids(
        self, ids: Sequence[str], return_dict_with_names: bool = True
    ) -> dict[str, Any]:
        """``{name: object}`` (or ``{id: object}``) for these ids.

        Raises:
            ComponentNotFoundError: an id is not registered.
        """
        with self._registry():
            missing = [component_id for component_id in ids if component_id not in self._entries]
            if missing:
                raise self._unknown(f"Unknown component id(s) {missing}.")
            if not return_dict_with_names:
                return {component_id: self._entries[component_id].component for component_id in ids}
            return self._by_names(list(ids), "pass return_dict_with_names=False.")

    def get_components_by_names(self, names: Sequence[str], collection: str | None = None) -> dict[str, Any]:
        """``{name: object}`` for the registered ones among ``names``: ready for ``update_components(**d)``."""
        with self._registry():
            return self._by_names(self.get_ids(list(names), collection), "pass collection=... to choose.")

    # ---- information ----------------------------------------------------------------------------------------

    def get_model_info(self, component_id: str, fields: str | Sequence[str] | None = None) -> dict[str, Any]:
        """Facts about one component; model-only fields are ``None`` for other components.

        Fields: ``model_id, added_time, collection, class_name, size_gb`` (unique storage bytes), ``device,
        dtype, load_id, adapters`` (peft adapter names), ``has_hook, execution_device, ip_adapter,
        quantization``.

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
        with self._registry():
            entry = self._entries.get(component_id)
            if entry is None:
                raise self._unknown(f"No component has id {component_id!r}.")
            collections = [
                name for name, members in self._collections.items() if component_id in members.values()
            ]
            engine = self._engine
        info = component_info(component_id, entry.component, entry.added_time, collections, engine)
        return {field: info[field] for field in wanted}

    def __repr__(self) -> str:
        with self._registry():
            return manager_table(self)

    __str__ = __repr__

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
