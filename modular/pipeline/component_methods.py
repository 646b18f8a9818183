"""The component methods of ``ModularPipeline``: what it holds, and loading, replacing and unloading it."""

from __future__ import annotations

import difflib
import logging
import weakref
from typing import TYPE_CHECKING, Any, cast

import attrs

from components import ComponentsManager, ComponentSpec
from components.load_id import LOAD_ID_FIELDS
from modular.pipeline.replacement import check_replacements
from offload import DiskCopyError

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks
    from modular.framework.planning import PlanCache
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["LIVE_PIPELINES", "ComponentMethods"]

logger = logging.getLogger(__name__)

# Every live pipeline: unload_components asks whether another one still runs a model it drops.
LIVE_PIPELINES: weakref.WeakSet[ComponentMethods] = weakref.WeakSet()


class ComponentMethods:
    """What a pipeline holds (specs, components, config values) and the calls that change it."""

    _blocks: ModularPipelineBlocks
    _plans: PlanCache
    _components_manager: ComponentsManager | None
    _collection: str | None
    _specs: dict[str, ComponentSpec]
    _config: dict[str, Any]
    _components: dict[str, Any]
    _absent: set[str]
    _unlisted: set[str]

    @property
    def components(self) -> dict[str, Any]:
        return dict(self._components)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._config)

    @property
    def component_names(self) -> list[str]:
        return list(self._specs)

    @property
    def null_component_names(self) -> list[str]:
        return [name for name, obj in self._components.items() if obj is None]

    @property
    def absent_component_names(self) -> list[str]:
        """Components the repo has none of (its index lists them as ``[null, null]``, or a classic
        ``model_index.json`` does not list them), until one is given: blocks that run without them
        (``optional_components``) are planned without them."""
        return [name for name in self._specs if name in self._absent]

    @property
    def pretrained_component_names(self) -> list[str]:
        return [n for n, s in self._specs.items() if s.default_creation_method == "from_pretrained"]

    @property
    def config_component_names(self) -> list[str]:
        return [n for n, s in self._specs.items() if s.default_creation_method == "from_config"]

    def get_component_spec(self, name: str) -> ComponentSpec:
        if name not in self._specs:
            raise KeyError(_unknown("component", name, self._specs))
        return self._specs[name]

    def _set_component(self, name: str, obj: Any) -> None:
        self._components[name] = obj
        cm = self._components_manager
        if cm is None or obj is None:
            return
        # From-config components (image processors, guiders) are each pipeline's own and are registered with
        # the pipeline as owner, so the manager drops them once the pipeline is garbage-collected. They are not
        # shared by (class, config) equality: a guider keeps per-call state and can be changed in place
        # (``guider.guidance_scale = 5``), and a shared one would couple pipelines that run at the same time.
        # Weights are what is worth sharing, and from_pretrained components are, by load ID.
        # Tests: tests/modular/test_pipeline_lifetime.py.
        owner = self if self._specs[name].default_creation_method == "from_config" else None
        known = cm.get_id(obj)
        if known is None:
            cm.add(name, obj, collection=self._collection, owner=owner)
        elif owner is not None and known == f"{name}_{id(obj)}":
            # Another pipeline's from-config object: it stays registered while either pipeline lives.
            cm.add(name, obj, owner=owner)
        # Otherwise the object is tracked already (perhaps under another name) and is used as it is.

    def load_components(
        self, names: list[str] | str | None = None, workflow: str | None = None, **kwargs: Any
    ) -> None:
        """Load components (all with a repo when ``names`` is None; ``workflow=``: those of them that the
        named workflow's blocks use, as the peer's ``load_components(workflow=...)``).

        Each keyword is a value for every component or a dict per component name with an optional
        ``"default"`` key, e.g. ``torch_dtype={"unet": torch.float16, "default": torch.float32}``.
        Without ``names``, components already loaded are kept unless their spec changed (``modular/pipeline/keep_loaded.py``).
        Through a manager, a component already loaded with the same load ID and options is reused.
        All or nothing: if one fails, none is kept.
        """
        from modular.pipeline.keep_loaded import names_to_load
        from modular.pipeline.loading import load_all

        pipe = cast("ModularPipeline", self)  # the one class that mixes these methods in
        if workflow is not None and names is not None:
            raise ValueError("load_components(): pass names or workflow=, not both")
        if names is None:
            names = names_to_load(pipe, kwargs)
            if workflow is not None:
                blocks = self._blocks.get_workflow(workflow)
                used = {spec.name for spec in blocks.expected_components} if blocks is not None else set()
                names = [name for name in names if name in used]
        loaded = load_all(pipe, names, kwargs)
        for name, (spec, obj) in loaded.items():
            self._specs[name] = spec
            self._components[name] = obj
            self._absent.discard(name)
            self._unlisted.discard(name)
        self._plans.forget()

    def update_components(self, **kwargs: Any) -> None:
        """Replace components (``unet=obj``) or config values (``name=value``)."""
        for name in kwargs:
            if name not in self._specs and name not in self._config:
                raise KeyError(_unknown("component or config", name, {**self._specs, **self._config}))
        # The blocks' declared type is what they accept (e.g. any scheduler); the repo's index only says
        # which class the repo holds, so a different scheduler class is still a valid replacement.
        given = {name: value for name, value in kwargs.items() if name not in self._config}
        check_replacements(self._blocks, self._specs, given)
        self._plans.forget()  # before too: a failure part way leaves no plan of the old components
        for name, value in kwargs.items():
            if name in self._config:
                self._config[name] = value
                continue
            if value is not None:
                self._specs[name] = _spec_for(self._specs[name], value)
                self._absent.discard(name)
                self._unlisted.discard(name)
            self._set_component(name, value)
        self._plans.forget()

    def unload_components(self, names: list[str] | str) -> None:
        """Drop components from the pipeline and from the manager, so their memory can be freed.

        A model another pipeline still runs (the manager shares it) leaves with its weights: one whose host
        copy is on disk under ``host_budget`` is read back first, so that pipeline's calls go on as before.
        """
        names = [names] if isinstance(names, str) else list(names)
        for name in names:
            if name not in self._specs:
                raise KeyError(_unknown("component", name, self._specs))
        self._plans.forget()  # before too: a failure part way leaves no plan of the old components
        for name in names:
            obj = self._components[name]
            self._components[name] = None
            cm = self._components_manager
            if cm is not None and obj is not None:
                component_id = cm.get_id(obj)
                if component_id is not None:
                    _remove(cm, component_id, shared=_run_elsewhere(obj, self))
        self._plans.forget()


def _unknown(kind: str, name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"no {kind} named {name!r}{hint} (known: {sorted(known)})"


def _spec_for(declared: ComponentSpec, obj: Any) -> ComponentSpec:
    """The spec of an object given to update_components: its load ID when it has one."""
    from components import get_load_id

    load_id = get_load_id(obj)
    changes: dict[str, Any] = {"type_hint": type(obj)}
    if load_id and load_id != "null":
        changes.update(ComponentSpec.decode_load_id(load_id))
    elif declared.default_creation_method == "from_pretrained":
        changes.update(dict.fromkeys(LOAD_ID_FIELDS))
        changes["subfolder"] = ""
    return attrs.evolve(declared, **changes)


def _run_elsewhere(obj: Any, pipe: ComponentMethods) -> bool:
    """Whether a live pipeline other than ``pipe`` holds ``obj`` as one of its components."""
    return any(
        other is not pipe and any(component is obj for component in other._components.values())
        for other in list(LIVE_PIPELINES)
    )


def _remove(cm: ComponentsManager, component_id: str, shared: bool) -> None:
    """Unregister a component a pipeline drops. Removal reads nothing back (a model whose host copy is on disk
    leaves as meta tensors), right for a model nobody runs any more; a ``shared`` one, which another pipeline
    still runs, leaves with its weights read back, so that pipeline goes on as before."""
    if shared:
        try:
            with cm.host_weights(component_id):
                cm.remove(component_id)
            return
        except DiskCopyError as error:  # its file is gone: nothing to read back, so it leaves without
            logger.warning("%s leaves without its weights on disk (%s)", component_id, error)
    cm.remove(component_id)
