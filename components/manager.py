"""ComponentsManager: one registry of loaded components that every pipeline shares."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from .manager_offload import OffloadMethods
from .model_calls import DEFAULT_WAIT_TIMEOUT
from .model_info import INFO_FIELDS, component_info
from .offload_link import OffloadLink
from .registry import Registry
from .shared_loads import SharedLoads
from .spec import ComponentSpec
from .table import check_width, manager_summary, manager_table, manager_text

__all__ = ["INFO_FIELDS", "ComponentsManager"]

logger = logging.getLogger(__name__)


class _Locked:
    """The manager's lock, entered after dropping the registrations whose owners are gone (``_locked``).

    One reusable object rather than a generator context per call: every public method enters it.
    """

    __slots__ = ("_lock", "_registry")

    def __init__(self, lock: threading.RLock, registry: Registry) -> None:
        self._lock = lock
        self._registry = registry

    def __enter__(self) -> Registry:
        self._lock.acquire()
        try:
            self._registry.release_collected()
        except BaseException:
            self._lock.release()
            raise
        return self._registry

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


class ComponentsManager(OffloadMethods):
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
        self._guard = _Locked(self._lock, self._registry)
        self._loads = SharedLoads(
            self._lock, self._locked, self._registry
        )  # get_or_load: reuse, or load once

    def _locked(self) -> AbstractContextManager[Registry]:
        """The lock, after dropping registrations whose owners are gone: every public method enters here."""
        return self._guard

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
            TypeError: ``owner`` does not support weak references, or ``component`` is ``None`` (nothing to
                register: a pipeline's missing component is not added, and two ``None`` would be one object).
        """
        if component is None:
            msg = (
                f"add({name!r}, None): None is not a component; leave it out (a pipeline registers only the "
                "components it holds)"
            )
            raise TypeError(msg)
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
        if component_id is not None and name is None and collection is None and load_id is None:
            # The common look-up is one dict read, without the lock (as cheap as the peer's): under the GIL a
            # read is atomic, so it answers as if it ran just before or just after a change in another thread.
            # Pending releases, and a miss (to raise under the lock), take the full path below.
            registry = self._registry
            if not registry.released:
                entry = registry.entries.get(component_id)
                if entry is not None:
                    return entry.component
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

    def table(self, width: int | None = None) -> str:
        """The table of every component: Name_ID, Class, Device, Dtype, Size, Load ID, Collection.

        ``width=None`` (the default) gives the full table, nothing shortened; ``cm.table(width=80)`` shrinks it
        towards 80 columns: Dtype without ``torch.``, load IDs shortened in the middle (the repo's last folder
        and ``|subfolder|variant|revision`` are kept), collection names wrapped. Each Size column has one unit,
        chosen from its largest value. A table that cannot be that narrow comes back in its narrowest form.

        Raises:
            TypeError: ``width`` is neither an int nor ``None``.
            ValueError: ``width`` is below 1.
        """
        check_width(width, "table")
        with self._locked():
            return manager_table(self, self._offload.residency, width)

    def summary(self, width: int | None = None) -> str:
        """One line per component: id, class, device, dtype, size, load ID and ``(collections)``.

        With ``width``, load IDs are shortened in the middle so that lines fit it. ``print(cm)`` shows this
        form when the terminal is too narrow for the table.

        Raises:
            TypeError: ``width`` is neither an int nor ``None``.
            ValueError: ``width`` is below 1.
        """
        check_width(width, "summary")
        with self._locked():
            return manager_summary(self, self._offload.residency, width)

    def __repr__(self) -> str:
        """The table fitted to the terminal's width (``shutil.get_terminal_size``: ``$COLUMNS``, else the
        terminal, else 80), or the summary when even the narrowest table is wider."""
        width = shutil.get_terminal_size().columns
        with self._locked():
            return manager_text(self, self._offload.residency, width)

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
