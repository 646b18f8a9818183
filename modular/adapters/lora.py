"""LoRA on any ``ModularPipeline``: diffusers' per-family LoRA loaders driven on the pipeline's components.

The family names its loader (``BlockFamily.lora_loader``, one of diffusers' ``*LoraLoaderMixin`` classes). A
mixin reads a classic pipeline's models as attributes (``self.unet``, ``self.text_encoder``); a ``LoraTarget``
stands in for that pipeline, holding this pipeline's models, so diffusers converts the keys (kohya/A1111,
diffusers, peft) and injects the layers with peft exactly as the classic pipeline does, and
``ModularPipeline`` inherits no family's mixin. What diffusers leaves open is checked here first, so that a bad
call changes nothing: keys that would go nowhere, an adapter name in use, unknown adapters, wrong weights.

Adapters live in the models: a LoRA loaded into a component that several pipelines share (one manager) is
theirs too. Each model records which pipeline loaded which adapter (``components.model_info``), and after any
change of weights (loading, fusing, unfusing, deleting, unloading) the manager refreshes the model's host copy,
so auto offload never brings stale weights back.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

import torch

from components.model_info import forget_lora_sources, lora_layers, record_lora_source
from modular.adapters.lora_checks import (
    adapters_of,
    check_keys,
    checked_weights,
    chosen_models,
    known_names,
    new_adapter_name,
)
from modular.adapters.lora_files import find_lora
from modular.adapters.lora_marks import mark_fused, mark_unfused
from modular.adapters.model_changes import changes_models
from modular.families import family_of_blocks

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["LoraMixin", "LoraTarget", "pipeline_label"]


class LoraTarget:
    """What a diffusers LoRA mixin sees as its pipeline: the models as attributes, nothing else.

    Made by ``_target_class`` as a subclass of the family's mixin. A loadable name without a model reads as
    ``None``, as on a classic pipeline without that component.
    """

    hf_device_map = None  # diffusers checks it for accelerate device maps; ours places models through offload
    _lora_loadable_modules: list[str]

    def __init__(self, models: Mapping[str, torch.nn.Module | None], check_keys: Any = None) -> None:
        self._models = dict(models)
        self._check_keys = check_keys

    def __getattr__(self, name: str) -> Any:
        models = self.__dict__.get("_models", {})
        if name in models or name in type(self)._lora_loadable_modules:
            return models.get(name)
        raise AttributeError(name)

    @property
    def components(self) -> dict[str, Any]:
        """The models, as diffusers' offload checks read a pipeline's components."""
        return dict(self._models)

    def lora_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The mixin's own conversion, then our check of the converted keys, before anything is injected."""
        converted = super().lora_state_dict(*args, **kwargs)  # type: ignore[misc]
        if self._check_keys is not None:
            self._check_keys(converted[0] if isinstance(converted, tuple) else converted)
        return converted


@functools.cache
def _target_class(loader: type) -> type:
    return type(f"{loader.__name__}Target", (LoraTarget, loader), {})


def lora_models(pipe: ModularPipeline) -> list[str] | None:
    """The components a LoRA call may change (``None``: the pipeline's family is unknown, so all)."""
    family = family_of_blocks(pipe.blocks_class_name)
    loader = None if family is None else family.loader("lora")
    return None if loader is None else list(getattr(loader, "_lora_loadable_modules", None) or []) or None


class LoraMixin:
    """The LoRA methods of ``ModularPipeline`` (``modular/adapters/lora.py``): the same names and arguments as diffusers'
    pipelines, for every family whose ``BlockFamily`` names a ``lora_loader``."""

    @changes_models(lora_models)
    def load_lora_weights(
        self,
        pretrained_model_name_or_path_or_dict: Any,
        weight_name: str | None = None,
        adapter_name: str | None = None,
        **hub_kwargs: Any,
    ) -> None:
        """Load a LoRA into the pipeline's models (denoiser and text encoders, as its keys say).

        Args:
            pretrained_model_name_or_path_or_dict: A state dict, a ``.safetensors`` file, a folder or a hub
                repo id. Key formats: whatever diffusers' loader of the family reads (diffusers, kohya/A1111,
                peft).
            weight_name: The file in the folder or repo; ``None``: its only LoRA file.
            adapter_name: The adapter's name; ``None``: ``default_<n>``, the first free in every model.
            **hub_kwargs: ``subfolder``, ``revision``, ``token``, ``local_files_only``, ``cache_dir`` and
                ``use_pickle`` (``.bin`` files are refused without it), as for components; and the options of
                the family's loader it names in ``BlockFamily.lora_options`` (Wan: ``load_into_transformer_2``).

        Raises:
            ValueError: the pipeline's family loads no LoRA, a model is not loaded, keys that match no
                component, or the adapter name is in use. Nothing is changed.
        """
        pipe = _pipe(self)
        loader = _loader(pipe, "load_lora_weights")
        models = _models(pipe, loader, "load_lora_weights")
        family = family_of_blocks(pipe.blocks_class_name)
        own = family.lora_options if family is not None else ()
        loader_options = {key: hub_kwargs.pop(key) for key in list(hub_kwargs) if key in own}
        source = find_lora(pretrained_model_name_or_path_or_dict, weight_name, hub_kwargs)
        name = new_adapter_name(adapter_name, models)
        before = {key: set(adapters_of(model)) for key, model in models.items() if model is not None}
        checker = functools.partial(check_keys, loader, models, source.describe())
        target = _target_class(loader)(models, checker)
        argument, options = source.loader_arguments()
        changed = [model for model in models.values() if model is not None]
        try:
            target.load_lora_weights(argument, adapter_name=name, **options, **loader_options)
        except BaseException:
            _undo_load(loader, models, name, before)
            raise
        finally:
            _refresh(pipe, changed)
        for model in changed:
            if name in adapters_of(model):
                record_lora_source(model, name, pipeline_label(pipe))

    @changes_models(lora_models)
    def set_adapters(self, adapter_names: str | list[str], adapter_weights: Any = None) -> None:
        """Make these adapters the active ones, with these weights.

        Args:
            adapter_names: One name or a list.
            adapter_weights: ``None`` (1.0 each), a number for all, a list with one per adapter, or per-component
                dicts such as ``{"unet": 0.8, "text_encoder": 0.5}`` (one for all, or one per adapter).

        Raises:
            ValueError: an unknown adapter, a list of weights of another length, a dict naming a component that
                takes no LoRA.
        """
        pipe = _pipe(self)
        loader = _loader(pipe, "set_adapters")
        models = _with_lora(pipe, loader, "set_adapters")
        names = known_names(adapter_names, models, "set_adapters")
        weights = checked_weights(adapter_weights, names, loader)
        _target_class(loader)(models).set_adapters(names, weights)

    def get_active_adapters(self) -> list[str]:
        """The names of the active adapters (empty when no LoRA is loaded)."""
        pipe = _pipe(self)
        loader = _loader(pipe, "get_active_adapters")
        models = _models(pipe, loader, None)
        return list(_target_class(loader)(models).get_active_adapters())

    def get_list_adapters(self) -> dict[str, list[str]]:
        """``{component: [adapter names]}`` for every model holding a LoRA."""
        pipe = _pipe(self)
        loader = _loader(pipe, "get_list_adapters")
        models = _models(pipe, loader, None)
        return {
            key: names for key, names in _target_class(loader)(models).get_list_adapters().items() if names
        }

    @changes_models(lora_models)
    def disable_lora(self) -> None:
        """Run without the LoRA layers (they stay loaded; ``enable_lora`` brings them back)."""
        pipe = _pipe(self)
        loader = _loader(pipe, "disable_lora")
        _target_class(loader)(_with_lora(pipe, loader, "disable_lora")).disable_lora()

    @changes_models(lora_models)
    def enable_lora(self) -> None:
        """Run with the active LoRA layers again after ``disable_lora``."""
        pipe = _pipe(self)
        loader = _loader(pipe, "enable_lora")
        _target_class(loader)(_with_lora(pipe, loader, "enable_lora")).enable_lora()

    @changes_models(lora_models)
    def delete_adapters(self, adapter_names: str | list[str]) -> None:
        """Remove these adapters' layers from every model.

        Raises:
            ValueError: an unknown adapter name (nothing is deleted).
        """
        pipe = _pipe(self)
        loader = _loader(pipe, "delete_adapters")
        models = _with_lora(pipe, loader, "delete_adapters")
        names = known_names(adapter_names, models, "delete_adapters")
        try:
            _target_class(loader)(models).delete_adapters(names)
        finally:
            _refresh(pipe, models.values())
        for model in models.values():
            forget_lora_sources(model, names)

    @changes_models(lora_models)
    def fuse_lora(
        self,
        lora_scale: float = 1.0,
        components: list[str] | None = None,
        adapter_names: list[str] | None = None,
        safe_fusing: bool = False,
    ) -> None:
        """Merge the active (or the named) adapters into the weights of the models, scaled by ``lora_scale``.

        Args:
            lora_scale: How much of the LoRA to merge.
            components: The models to fuse (``["unet"]``); ``None``: every model holding a LoRA.
            adapter_names: The adapters to fuse; ``None``: the active ones.
            safe_fusing: Refuse to fuse weights that would hold NaN.

        Raises:
            ValueError: no LoRA is loaded, a component takes or holds none, an unknown adapter.
        """
        pipe = _pipe(self)
        loader = _loader(pipe, "fuse_lora")
        if isinstance(lora_scale, bool) or not isinstance(lora_scale, numbers.Real):
            msg = f"fuse_lora: lora_scale must be a number (got {lora_scale!r})"
            raise TypeError(msg)
        models = chosen_models(_with_lora(pipe, loader, "fuse_lora"), components, loader, "fuse_lora")
        names = None if adapter_names is None else known_names(adapter_names, models, "fuse_lora")
        with _host_weights(pipe, models.values()):  # fused in place: never into a dropped host copy
            try:
                _target_class(loader)(models).fuse_lora(
                    components=list(models),
                    lora_scale=lora_scale,
                    safe_fusing=safe_fusing,
                    adapter_names=names,
                )
            finally:
                _refresh(pipe, models.values())
                # what fused before a failure is marked too
                mark_fused(models.values(), lora_scale, pipeline_label(pipe))

    @changes_models(lora_models)
    def unfuse_lora(self, components: list[str] | None = None) -> None:
        """Take fused adapters back out of the weights (``components``: as for ``fuse_lora``)."""
        pipe = _pipe(self)
        loader = _loader(pipe, "unfuse_lora")
        models = chosen_models(_with_lora(pipe, loader, "unfuse_lora"), components, loader, "unfuse_lora")
        with _host_weights(pipe, models.values()):  # the mark compares with the source: real weights only
            try:
                _target_class(loader)(models).unfuse_lora(components=list(models))
            finally:
                _refresh(pipe, models.values())
                mark_unfused(models.values())

    @changes_models(lora_models)
    def unload_lora_weights(self) -> None:
        """Remove every LoRA layer from the models (fused weights stay fused); a no-op without LoRA."""
        pipe = _pipe(self)
        loader = _loader(pipe, "unload_lora_weights")
        models = {
            key: model
            for key, model in _models(pipe, loader, None).items()
            if model is not None
            and (adapters_of(model) or lora_layers(model))  # layers outlive deleted adapters
        }
        if not models:
            return
        try:
            _target_class(loader)(models).unload_lora_weights()
        finally:
            _refresh(pipe, models.values())
        for model in models.values():
            forget_lora_sources(model, None)


# ----- the pipeline's family and models -----


def _pipe(obj: LoraMixin) -> ModularPipeline:
    return cast("ModularPipeline", obj)


def _loader(pipe: ModularPipeline, what: str) -> Any:
    family = family_of_blocks(pipe.blocks_class_name)
    if family is None or family.loader("lora") is None:
        where = (
            f"its blocks ({pipe.blocks_class_name}) belong to no installed family"
            if family is None
            else f"its family {family.name!r} names no lora_loader"
        )
        msg = (
            f"{what}: this pipeline cannot take a LoRA: {where}. Build it from a family's blocks (e.g. "
            "ModularPipeline.from_pretrained(repo)), or register a BlockFamily with lora_loader= set to the "
            "diffusers *LoraLoaderMixin of its models (modular.register_family)."
        )
        raise ValueError(msg)
    return family.loader("lora")


def _models(pipe: ModularPipeline, loader: Any, what: str | None) -> dict[str, torch.nn.Module | None]:
    """The pipeline's models the loader loads into, by name (``None`` when the pipeline has no such one).

    With ``what``, a model the pipeline declares but has not loaded is an error: diffusers would fail on it. One the
    repo has none of (``absent_component_names``: Wan 2.1's ``transformer_2``) is left out, as a pipeline without it.
    """
    components = pipe.components
    absent = set(pipe.absent_component_names)
    models: dict[str, torch.nn.Module | None] = {}
    for key in loader._lora_loadable_modules:
        obj = components.get(key)
        if key in components and obj is None and what is not None and key not in absent:
            msg = f"{what}: component {key!r} is not loaded; call pipe.load_components() first"
            raise ValueError(msg)
        models[key] = obj if isinstance(obj, torch.nn.Module) else None
    return models


def _with_lora(pipe: ModularPipeline, loader: Any, what: str) -> dict[str, torch.nn.Module | None]:
    """The models holding a LoRA; none is an error naming ``what``."""
    models = {key: model for key, model in _models(pipe, loader, None).items() if adapters_of(model)}
    if not models:
        msg = f"{what}: no LoRA is loaded in this pipeline; load one with pipe.load_lora_weights(...) first"
        raise ValueError(msg)
    return models


def pipeline_label(pipe: ModularPipeline) -> str:
    """How the manager's table names the pipeline that loaded an adapter."""
    collection = pipe._collection
    label = f"{pipe.blocks_class_name}@{id(pipe):#x}"
    return f"{label} (collection {collection!r})" if collection else label


def _refresh(pipe: ModularPipeline, models: Iterable[torch.nn.Module | None]) -> None:
    """Tell the manager that these models' weights changed, so auto offload keeps their host copies true."""
    cm = pipe.components_manager
    if cm is None:
        return
    for model in models:
        component_id = cm.get_id(model) if model is not None else None
        if component_id is not None:
            cm.refresh_host_copy(component_id, edited=False)  # fuse/unfuse mark their models themselves


def _host_weights(
    pipe: ModularPipeline, models: Iterable[torch.nn.Module | None]
) -> AbstractContextManager[None]:
    """These models' weights in memory while inside (``ComponentsManager.host_weights``): one whose host copy
    was dropped under a host budget is read back first, so a change in place meets real tensors (refreshed
    inside, before the budget drops copies again)."""
    cm = pipe.components_manager
    return contextlib.nullcontext() if cm is None else cm.host_weights(*(m for m in models if m is not None))


def _undo_load(loader: Any, models: Mapping[str, torch.nn.Module | None], name: str, before: dict) -> None:
    """Take a half-loaded adapter out again: its layers, or every LoRA layer of a model that had none before."""
    for key, model in models.items():
        if model is None:
            continue
        single = _target_class(loader)({key: model})
        if not before[key] and (lora_layers(model) or adapters_of(model)):
            single.unload_lora_weights()
        elif name in adapters_of(model):
            single.delete_adapters([name])
