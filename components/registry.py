"""The manager's records: registered objects by id, their collections, and the owners they last for.

``Registry`` is not thread safe: ``ComponentsManager`` calls it with its lock held. Registrations whose
owners were garbage-collected are queued by the collector and dropped at ``release_collected``.
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from .errors import ComponentNotFoundError
from .load_id import canonical_load_id, get_load_id
from .reuse import LoadOptions
from .search import compile_pattern
from .weight_marks import is_modified

__all__ = ["Entry", "Registry"]

logger = logging.getLogger("components.manager")  # the manager's logger: this is its bookkeeping

_serials = itertools.count()


@attrs.define
class Entry:
    """One registration: the object, its name, when it was added and the load options it was loaded with."""

    component: Any
    name: str
    added_time: float
    options: LoadOptions
    # How many owners (with their finalizers) still hold this registration; None: kept until removed.
    owners: int | None = None
    # Tells a late finalizer of a removed registration from one of a new registration under the same id.
    serial: int = attrs.field(factory=lambda: next(_serials))
    # The component's load ID tag and its canonical form, resolved at the first look-up that reads it: a
    # resolution reads the filesystem (realpath), and a serving replica looks up every served model at each
    # residency report and each pick of a job (30 ms a report with 3 families, 16 components). Resolved
    # again only when the tag changes.
    resolved_tag: tuple[str, str] | None = attrs.field(default=None, eq=False, repr=False)


def _release_later(registry_ref: weakref.ref[Registry], component_id: str, serial: int) -> None:
    # Runs from the garbage collector, at any allocation, in any thread, perhaps while this very thread is
    # iterating the registry or holding the offload engine's lock: so it only queues (deque.append is atomic)
    # and the manager drains the queue at its next public call. Test: test_owner_finalizer_only_queues.
    registry = registry_ref()
    if registry is not None:
        registry.released.append((component_id, serial))


def _check_owner(name: str, owner: Any) -> None:
    try:
        weakref.ref(owner)
    except TypeError:
        msg = (
            f"Cannot add {name!r} with owner={type(owner).__name__}: an owner must support weak references "
            "(the registration is dropped when the owner is garbage-collected)."
        )
        raise TypeError(msg) from None


class Registry:
    """Registered objects under ids ``"<name>_<id(obj)>"``, named collections of them, and their owners.

    Args:
        on_add: Called with ``(component id, object)`` before a new object is recorded; what it raises
            leaves nothing recorded (the manager attaches models to offload here).
        on_remove: Called with ``(component id, object)`` before an object's record goes.
    """

    def __init__(self, on_add: Callable[[str, Any], None], on_remove: Callable[[str, Any], None]) -> None:
        self.entries: dict[str, Entry] = {}
        self._ids: dict[
            int, str
        ] = {}  # id(object) -> component id: a registered object lives while it is here
        self.collections: dict[str, dict[str, str]] = {}  # collection -> {name: component id}
        self.released: deque[tuple[str, int]] = deque()  # (id, serial) whose owner was garbage-collected
        self._on_add = on_add
        self._on_remove = on_remove

    def release_collected(self) -> None:
        """Drops the registrations whose owners have all been garbage-collected since the last call."""
        while self.released:
            component_id, serial = self.released.popleft()
            entry = self.entries.get(component_id)
            if entry is None or entry.serial != serial or entry.owners is None:
                continue  # removed, replaced or made permanent since
            entry.owners -= 1
            if entry.owners == 0:
                logger.info("Releasing %s: its owners are gone", component_id)
                self.remove(component_id)

    def unknown(self, what: str) -> ComponentNotFoundError:
        """The error for a look-up that found nothing: ``what`` went wrong, then what is registered."""
        ids = list(self.entries) or "none"
        return ComponentNotFoundError(f"{what} Registered components: {ids}.")

    def id_of(self, component: Any) -> str | None:
        """The id ``component`` (the very object) is registered under, or ``None``."""
        return self._ids.get(id(component))

    # ---- adding and removing --------------------------------------------------------------------------------

    def add(
        self, name: str, component: Any, collection: str | None, options: LoadOptions | None, owner: Any
    ) -> str:
        """Records ``component`` (see ``ComponentsManager.add``) and returns its id."""
        if not isinstance(name, str) or not name.isidentifier():
            msg = f"Component name must be a Python identifier such as 'unet' (got {name!r})."
            raise ValueError(msg)
        if owner is not None:
            _check_owner(name, owner)
        component_id = self.id_of(component)
        if component_id is not None and self.entries[component_id].name != name:
            msg = (
                f"Cannot add {type(component).__name__} as {name!r}: the same object is registered as "
                f"{component_id!r}, and an object has one name in a manager. Use that id, or remove it first."
            )
            raise ValueError(msg)
        if component_id is None:
            component_id = f"{name}_{id(component)}"
            self._on_add(component_id, component)
            options = options or LoadOptions.from_object(component)
            owners = 0 if owner is not None else None
            self.entries[component_id] = Entry(component, name, time.time(), options, owners=owners)
            self._ids[id(component)] = component_id
            logger.info("Added component %s", component_id)
        entry = self.entries[component_id]
        if owner is None:
            entry.owners = None
        elif entry.owners is not None:
            entry.owners += 1
            finalizer = weakref.finalize(owner, _release_later, weakref.ref(self), component_id, entry.serial)
            finalizer.atexit = False
        if collection is not None:
            self.put_in_collection(component_id, name, collection)
        return component_id

    def put_in_collection(self, component_id: str, name: str, collection: str) -> None:
        """Puts a component in ``collection``; an older one of that name leaves it, and the registry too when
        no other collection holds it."""
        members = self.collections.setdefault(collection, {})
        previous = members.get(name)
        members[name] = component_id
        if previous is not None and previous != component_id:
            logger.info("Collection %r: %s replaces %s", collection, component_id, previous)
            if not self.collections_of(previous):
                self.remove(previous)

    def remove(self, component_id: str) -> None:
        """Forgets a registered component and takes it out of every collection."""
        entry = self.entries[component_id]
        self._on_remove(component_id, entry.component)
        del self.entries[component_id]
        del self._ids[id(entry.component)]
        for collection, members in list(self.collections.items()):
            for name, member in list(members.items()):
                if member == component_id:
                    del members[name]
            if not members:
                del self.collections[collection]
        logger.info("Removed component %s", component_id)

    def remove_from_collection(self, component_id: str, collection: str) -> None:
        """Takes a component out of a collection, and out of the registry when no collection holds it."""
        members = self.collections.get(collection)
        if members is None or component_id not in members.values():
            held = list(members.values()) if members else []
            msg = (
                f"Collection {collection!r} does not hold {component_id!r} (it holds {held}; collections: "
                f"{list(self.collections)})."
            )
            raise ComponentNotFoundError(msg)
        for name, member in list(members.items()):
            if member == component_id:
                del members[name]
        if not members:
            del self.collections[collection]
        if not self.collections_of(component_id):
            self.remove(component_id)

    # ---- look-ups -------------------------------------------------------------------------------------------

    def collections_of(self, component_id: str) -> list[str]:
        """The collections holding a component, in creation order."""
        return [name for name, members in self.collections.items() if component_id in members.values()]

    def find_reusable(self, load_id: str, options: LoadOptions) -> str | None:
        """The id of a component loaded from ``load_id`` that can serve a load with ``options``, or ``None``.

        A model whose weights no longer are its load ID's (a fused LoRA, an edit; ``components.weight_marks``)
        serves no load: the request gets a fresh copy of the source.
        """
        load_id = canonical_load_id(load_id)
        for component_id, entry in self.entries.items():
            if is_modified(entry.component):
                continue
            if self._loaded_from(entry, load_id) and entry.options.serves(options, entry.component):
                return component_id
        return None

    def select(self, names: str | None, collection: str | None, load_id: str | None) -> list[str]:
        """Ids matching a name pattern (``components.search``), a collection and a load ID (``None``: any)."""
        predicate = compile_pattern(names) if names is not None else None
        members = self._members(collection)
        load_id = (
            None if load_id is None else canonical_load_id(load_id)
        )  # "tiny-sd|vae|..." finds its folder's
        return [
            component_id
            for component_id, entry in self.entries.items()
            if (predicate is None or predicate(entry.name))
            and (members is None or component_id in members)
            and (load_id is None or self._loaded_from(entry, load_id))
        ]

    @staticmethod
    def _loaded_from(entry: Entry, load_id: str) -> bool:
        """Whether the entry's component was loaded from ``load_id`` (canonical): a tag spelled otherwise (the
        peer tags what it loads with the repo as the user wrote it) names the same folder."""
        tag = get_load_id(entry.component)
        if tag is None:
            return False
        if entry.resolved_tag is None or entry.resolved_tag[0] != tag:
            entry.resolved_tag = (tag, canonical_load_id(tag))
        return entry.resolved_tag[1] == load_id

    def ids_named(self, names: Iterable[str] | None, collection: str | None) -> list[str]:
        """Ids of the components with these exact names (all when ``None``), optionally in one collection."""
        wanted = None if names is None else set(names)
        members = self._members(collection)
        return [
            component_id
            for component_id, entry in self.entries.items()
            if (wanted is None or entry.name in wanted) and (members is None or component_id in members)
        ]

    def _members(self, collection: str | None) -> set[str] | None:
        return set(self.collections.get(collection, {}).values()) if collection is not None else None

    def by_names(self, ids: Iterable[str], hint: str) -> dict[str, Any]:
        """``{name: object}`` for ``ids``; two of one name raise ValueError ending with ``hint``."""
        ids = list(ids)
        result: dict[str, Any] = {}
        for component_id in ids:
            entry = self.entries[component_id]
            if entry.name in result:
                same = [i for i in ids if self.entries[i].name == entry.name]
                msg = f"Several components are named {entry.name!r} ({same}); {hint}"
                raise ValueError(msg)
            result[entry.name] = entry.component
        return result

    def by_ids(self, ids: Iterable[str]) -> dict[str, Any]:
        """``{component id: object}`` for ``ids``."""
        return {component_id: self.entries[component_id].component for component_id in ids}
