"""Diffusers' own modular pipelines (the peer's) on our ``ComponentsManager``: shared loads and a plan per call.

The peer's pipeline already registers its loaded components with the manager it is given (``add``) and
unregisters them on ``unload_components`` (``remove``), so it shows in the table and runs under our auto
offload as it is. Two things it cannot do alone, which this module adds:

- **Share by load ID.** The peer's ``load_components`` always loads; ``load_peer_components`` takes what
  the manager already holds with the same load ID and options (loaded by our pipelines or another peer
  pipeline) and loads only the rest, through ``ComponentsManager.get_or_load``.
- **A plan.** The peer never tells a manager which models a call will run, so a next-use strategy would
  decide blind. ``PlannedPeerPipeline`` walks the peer's block tree for the call's inputs (the peer's own
  ``get_execution_blocks``) and passes the executed blocks' ``expected_components``, in order, to
  ``ComponentsManager.set_execution_plan`` before each call.

It lives in ``components/`` because it knows the peer's pipeline objects and our manager, nothing of
``modular/``; it reads only the peer's public API.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .manager import ComponentsManager
from .spec import ComponentSpec

__all__ = ["PlannedPeerPipeline", "load_peer_components", "peer_component_uses"]


def _check_peer(pipeline: Any, what: str) -> None:
    from diffusers.modular_pipelines import ModularPipeline as PeerModularPipeline

    if not isinstance(pipeline, PeerModularPipeline):
        msg = (
            f"{what} takes a diffusers ModularPipeline (from diffusers.modular_pipelines), got "
            f"{type(pipeline).__name__}. Our own ModularPipeline tells the manager its plan itself."
        )
        raise TypeError(msg)


def _check_manager(manager: Any, what: str) -> None:
    if not isinstance(manager, ComponentsManager):
        msg = f"{what}: manager must be a components.ComponentsManager (got {type(manager).__name__})."
        raise TypeError(msg)


# ---- the plan ---------------------------------------------------------------------------------------------


def _executed(block: Any, given: dict[str, Any]) -> list[Any]:
    """The leaf blocks ``block`` runs for ``given``, in order; a loop's body is listed once, in its place."""
    from diffusers.modular_pipelines import LoopSequentialPipelineBlocks

    if isinstance(block, LoopSequentialPipelineBlocks):
        return [leaf for child in block.sub_blocks.values() for leaf in _executed(child, given)]
    if not block.sub_blocks:
        return [block]
    # The peer's own walk picks branches by which inputs are given (and which outputs earlier blocks make);
    # it returns a leaf, a loop, or a sequence of leaves and loops.
    chosen = block.get_execution_blocks(**given)
    if chosen is None:
        return []
    if isinstance(chosen, LoopSequentialPipelineBlocks) or not chosen.sub_blocks:
        return _executed(chosen, given)
    return [leaf for child in chosen.sub_blocks.values() for leaf in _executed(child, given)]


def peer_component_uses(pipeline: Any, **inputs: Any) -> list[str]:
    """The names of the components a peer pipeline's call with ``inputs`` will use, in order.

    Each executed block contributes its ``expected_components`` in declaration order; a denoising loop's body
    is listed once (the engine's plan learns the loop from the uses). Repeats in a row are merged. A block may
    declare a model it reads only the config of (the SDXL latents step declares the VAE): such a use is
    predicted but never seen, which costs the strategy a little foresight and nothing else.

    Args:
        pipeline: A diffusers ``ModularPipeline``.
        **inputs: The call's inputs (only which are given, not ``None``, chooses branches).

    Raises:
        TypeError: ``pipeline`` is not a diffusers ``ModularPipeline``.
    """
    _check_peer(pipeline, "peer_component_uses()")
    given = {name: value for name, value in inputs.items() if value is not None}
    names: list[str] = []
    for block in _executed(pipeline.blocks, given):
        for spec in block.expected_components:
            if not names or names[-1] != spec.name:
                names.append(spec.name)
    return names


class PlannedPeerPipeline:
    """A diffusers ``ModularPipeline`` that tells its ``ComponentsManager`` the plan before every call.

    Call it as the peer's pipeline is called (``planned(prompt=..., output="images")``); every other
    attribute is the wrapped pipeline's (``planned.load_components``, ``planned.update_components``, ...).
    Plans (component names) are cached per set of given input names; the objects are looked up at each call,
    so components swapped with ``update_components`` are planned as they are.

    Args:
        pipeline: A diffusers ``ModularPipeline``.
        manager: Our ``ComponentsManager``; its engine receives the plan while auto offload is on.

    Raises:
        TypeError: ``pipeline`` is not a diffusers ``ModularPipeline``, or ``manager`` not ours.
    """

    def __init__(self, pipeline: Any, manager: ComponentsManager) -> None:
        _check_peer(pipeline, "PlannedPeerPipeline")
        _check_manager(manager, "PlannedPeerPipeline")
        self.pipeline = pipeline
        self.manager = manager
        self._plans: dict[frozenset[str], list[str]] = {}

    def __repr__(self) -> str:
        return (
            f"PlannedPeerPipeline({type(self.pipeline).__name__}, manager of {len(self.manager)} components)"
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks: the peer pipeline answers them.
        if name in ("pipeline", "manager", "_plans"):
            raise AttributeError(name)
        return getattr(self.pipeline, name)

    def plan(self, state: Any = None, **inputs: Any) -> list[Any]:
        """The models a call with these inputs will run, in order (what ``__call__`` gives the manager)."""
        given = {**(dict(state.values) if state is not None else {}), **inputs}
        given = {name: value for name, value in given.items() if value is not None}
        key = frozenset(given)
        names = self._plans.get(key)
        if names is None:
            names = self._plans[key] = peer_component_uses(self.pipeline, **given)
        components = self.pipeline.components
        models: list[Any] = []
        for name in names:
            model = components.get(name)
            if isinstance(model, torch.nn.Module) and not (models and models[-1] is model):
                models.append(model)
        return models

    def __call__(self, state: Any = None, output: str | list[str] | None = None, **inputs: Any) -> Any:
        """Runs the peer pipeline after telling the manager which models it will use (see ``plan``)."""
        self.manager.set_execution_plan(self.plan(state, **inputs))
        return self.pipeline(state, output=output, **inputs)


# ---- loading through the manager ------------------------------------------------------------------------


def _our_spec(peer_spec: Any) -> ComponentSpec:
    """Our spec for one of the peer's ``from_pretrained`` specs: same name, class and load ID."""
    repo = peer_spec.pretrained_model_name_or_path
    if not isinstance(repo, str):
        msg = (
            f"Component {peer_spec.name!r}: pretrained_model_name_or_path must be one repo (a str) to load "
            f"through the manager (got {repo!r}). Load it yourself and pass it with update_components()."
        )
        raise TypeError(msg)
    return ComponentSpec(
        name=peer_spec.name,
        type_hint=peer_spec.type_hint,
        pretrained_model_name_or_path=repo,
        subfolder=peer_spec.subfolder,
        variant=peer_spec.variant,
        revision=peer_spec.revision,
    )


def _names_to_load(pipeline: Any, names: str | Sequence[str] | None) -> list[str]:
    block_names = dict.fromkeys(spec.name for spec in pipeline.blocks.expected_components)
    specs = [pipeline.get_component_spec(name) for name in block_names]
    loadable = [
        spec.name
        for spec in specs
        if spec.default_creation_method == "from_pretrained" and spec.pretrained_model_name_or_path
    ]
    if names is None:
        # The peer's rule: components already set are kept. A spec without a class is one the repo's index
        # lists as [null, null], a component it does not have (the peer tries it and logs the failure).
        typed = {spec.name for spec in specs if spec.type_hint is not None}
        return [name for name in loadable if name in typed and getattr(pipeline, name, None) is None]
    wanted = [names] if isinstance(names, str) else list(names)
    unknown = [name for name in wanted if name not in loadable]
    if unknown:
        msg = (
            f"load_peer_components(): {unknown} are not components this pipeline loads from a repo; "
            f"it loads {loadable}."
        )
        raise KeyError(msg)
    return wanted


def load_peer_components(
    pipeline: Any,
    manager: ComponentsManager,
    names: str | Sequence[str] | None = None,
    collection: str | None = None,
    **load_options: Any,
) -> dict[str, Any]:
    """Loads a peer pipeline's components through ``manager``: what it holds already is shared, not loaded.

    Each component's spec (the peer's, from its index) becomes a ``ComponentSpec`` of ours with the same
    name, class and load ID and goes through ``manager.get_or_load``: a registered object of that load ID and
    options (loaded by one of our pipelines, or by another peer pipeline) is reused, the rest is loaded with
    our loader (safetensors only unless ``use_pickle=True``) and registered. Then the pipeline receives them
    all with ``update_components``. All or nothing: if one load fails, what this call loaded is removed from
    the manager and the pipeline is left as it was.

    Args:
        pipeline: A diffusers ``ModularPipeline`` made with ``components_manager=manager``.
        manager: Our ``ComponentsManager``.
        names: Components to load; ``None``: every component not set yet whose spec names a repo and a class
            (a classic index's ``[null, null]`` entry is a component the repo lacks).
        collection: Collection to put them in; ``None``: the pipeline's own.
        **load_options: As for ``ComponentsManager.get_or_load`` (one value for all components).

    Returns:
        ``{name: object}`` of what the pipeline received.

    Raises:
        TypeError: ``pipeline`` or ``manager`` is of the wrong kind, or a spec names several repos.
        KeyError: a name is not a component the pipeline loads from a repo.
        ValueError: ``manager`` is not the manager the pipeline registers with.
        components.ComponentLoadError: a load failed (nothing changed).
    """
    _check_peer(pipeline, "load_peer_components()")
    _check_manager(manager, "load_peer_components()")
    # The peer keeps its manager in a private attribute; a pipeline on another manager (or none) would
    # register what we hand it elsewhere, and two managers would place one model.
    if getattr(pipeline, "_components_manager", None) is not manager:
        msg = (
            "load_peer_components(): the pipeline was made without this manager. Make it with "
            "components_manager=manager (init_pipeline(..., components_manager=cm) or from_pretrained)."
        )
        raise ValueError(msg)
    names = _names_to_load(pipeline, names)
    specs = [_our_spec(pipeline.get_component_spec(name)) for name in names]
    collection = collection if collection is not None else getattr(pipeline, "_collection", None)
    before = set(manager.components)
    loaded: dict[str, Any] = {}
    try:
        for spec in specs:
            loaded[spec.name] = manager.get_or_load(spec, collection, **load_options)
    except BaseException:
        _remove_new(manager, before, loaded.values())
        raise
    if loaded:
        pipeline.update_components(**loaded)
    return loaded


def _remove_new(manager: ComponentsManager, before: set[str], objects: Iterable[Any]) -> None:
    """Unregisters the objects of ``objects`` that were not registered before this call."""
    for obj in objects:
        component_id = manager.get_id(obj)
        if component_id is not None and component_id not in before:
            manager.remove(component_id)
