"""Loading through the manager: a registered object is reused by load ID and options, and two threads asking
for the same thing load it once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import attrs

from .load_kwargs import split_load_kwargs
from .registry import Registry
from .reuse import LoadOptions
from .spec import ComponentSpec

__all__ = ["SharedLoads"]

logger = logging.getLogger(__name__)
# diffusers' and transformers' ``from_pretrained`` build a model under a context that patches torch for the
# whole process (empty weights on the meta device): two loads at once in one process, of any managers, leave
# meta tensors in one of them. Loads take turns; everything else goes on meanwhile.
_LOADING = threading.RLock()


class SharedLoads:
    """The manager's ``get_or_load``: find a registered object that serves the request, else load and register.

    Args:
        lock: The manager's lock (held while the registry is read or changed, never during a load).
        locked: The manager's ``_locked()``: the lock, after dropping registrations whose owners are gone.
        registry: The manager's registry.
    """

    def __init__(
        self,
        lock: threading.RLock,
        locked: Callable[[], AbstractContextManager[Registry]],
        registry: Registry,
    ) -> None:
        self._lock = lock
        self._locked = locked
        self._registry = registry
        self._loading: dict[tuple[str, LoadOptions], threading.Lock] = {}

    def get_or_load(self, spec: ComponentSpec, collection: str | None, load_options: dict[str, Any]) -> Any:
        """See ``ComponentsManager.get_or_load`` (from-config specs are the manager's to create)."""
        fields, options = split_load_kwargs(load_options, f"ComponentSpec.load() for {spec.name!r}")
        spec = attrs.evolve(spec, **fields) if fields else spec
        # Keyed on the component's own quantization config, so a pipeline-wide one reuses per component.
        options = {**options, "quantization_config": spec.resolve_quantization(**options)}
        reuse = LoadOptions.from_request(options)
        key = (spec.load_id, reuse)
        with self._locked():
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                found = self._registry.find_reusable(spec.load_id, reuse)
                if found is not None:
                    entry = self._registry.entries[found]
                    if collection is not None:
                        self._registry.put_in_collection(found, entry.name, collection)
                    logger.info("Reusing %s for %s", found, spec.load_id)
                    return entry.component
            try:
                # Outside the registry lock: other work goes on meanwhile.
                with _LOADING:
                    component = spec.load(**options)
                with self._locked() as registry:
                    registry.add(spec.name, component, collection, reuse, None)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            return component
