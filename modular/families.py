"""Block families: how a repo's pipeline class maps to blocks, found through entry points."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

import attrs

from components.public_repr import public_repr
from modular._siblings import check_siblings

__all__ = ["BlockFamily", "available_families", "family_for_index", "family_of_blocks", "register_family"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "modular.blocks"


def _names(values: Iterable[str]) -> tuple[str, ...]:
    # A named converter rather than ``converter=tuple``: mypy's attrs plugin then types the argument.
    return tuple(values)


def _types(values: Sequence[type | str]) -> tuple[type | str, ...]:
    return tuple(values)


def _inputs(values: Mapping[str, Any]) -> dict[str, Any]:
    return dict(values)


@attrs.frozen(repr=False)
class BlockFamily:
    """One pipeline family written with the framework.

    A family may name its classes and functions by dotted path (``"blocks.flux.modular_blocks.FluxAutoBlocks"``)
    rather than by value: they are imported when first used, so that finding the installed families (the
    entry points, ``modular families``) imports none of their modules, nor torch or diffusers. Names
    (``blocks_class_names``), workflows when declared, and the classic pipelines are read without importing.

    Attributes:
        name: The family's model name, e.g. ``"stable-diffusion"``.
        blocks_class: The blocks that ``from_pretrained`` builds for this family's repos (a class or its path).
        classic_pipelines: The ``_class_name`` values of classic ``model_index.json`` files it serves.
        make_tiny_repo: ``make_tiny_repo(folder)`` writes a tiny random repo (for tests and the demo); a
            function or its path.
        tiny_repo_inputs: Call inputs that suit the tiny repo where the family's defaults do not
            (e.g. a small ``height``/``width`` for a model whose default size is 1024).
        variants: Other blocks classes of the family (e.g. a refiner's), known by name in saved indexes;
            classes or their paths.
        choose_blocks: ``choose_blocks(index) -> blocks class`` for a classic index whose contents,
            not only its ``_class_name``, decide (e.g. a refiner repo without ``text_encoder``).
        peer_pipeline_class: The pipeline class diffusers' modular system builds for this family
            (``"FluxModularPipeline"``). Saved indexes name it as ``_class_name``, so the peer builds
            the class that carries what its own blocks need and can run what we save.
        peer_pipeline_classes: Per blocks class name, the peer's pipeline class where the family's blocks
            classes map to different ones (Wan: ``{"Wan22Blocks": "Wan22ModularPipeline", ...}``); a blocks
            class not named here gets ``peer_pipeline_class``.
        demo: ``demo(folder) -> modular.batch.jobs.Demo``: the family's built-in scenario, its repos written
            under ``folder``; ``modular run`` without a repo runs the first family's that has one. A
            function or its path.
        lora_loader: The diffusers ``*LoraLoaderMixin`` that reads this family's LoRA files and loads them
            into its models (``StableDiffusionLoraLoaderMixin``); ``None``: the family takes no LoRA.
            ``ModularPipeline.load_lora_weights`` drives it (``modular/adapters/lora.py``). A class, or its dotted
            path (``"diffusers.loaders.FluxLoraLoaderMixin"``), imported when first needed: diffusers'
            loader modules are slow to import and some log warnings when they are.
        lora_options: Keywords of ``lora_loader``'s own ``load_lora_weights`` that a call may pass through, as
            given (Wan's ``load_into_transformer_2``: the LoRA goes into the low-noise expert).
        ip_adapter_loader: The diffusers pipeline mixin whose ``load_ip_adapter`` reads this family's
            IP-Adapter files (``ModularIPAdapterMixin``, ``FluxIPAdapterMixin``); ``None``: the family takes
            none. ``ModularPipeline.load_ip_adapter`` drives it (``modular/adapters/ip_adapter.py``). A class or its
            dotted path, as ``lora_loader``.
        workflows: The named workflows of ``blocks_class``, declared so that listing them imports nothing;
            ``None``: asked of the blocks (tests/test_startup.py checks that the declared ones are theirs).
    """

    name: str
    _blocks_class: type | str = attrs.field(alias="blocks_class")
    classic_pipelines: tuple[str, ...] = attrs.field(default=(), converter=_names)
    _make_tiny_repo: Callable | str | None = attrs.field(default=None, alias="make_tiny_repo")
    tiny_repo_inputs: Mapping[str, Any] = attrs.field(factory=dict, converter=_inputs)
    _variants: tuple[type | str, ...] = attrs.field(default=(), converter=_types, alias="variants")
    choose_blocks: Callable[[Mapping[str, Any]], type] | None = None
    peer_pipeline_class: str = "ModularPipeline"
    peer_pipeline_classes: Mapping[str, str] = attrs.field(factory=dict, converter=_inputs)
    _demo: Callable[[Path], Any] | str | None = attrs.field(default=None, alias="demo")
    lora_loader: type | str | None = None
    lora_options: tuple[str, ...] = attrs.field(default=(), converter=_names)
    ip_adapter_loader: type | str | None = None
    _workflows: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_names), alias="workflows"
    )

    __repr__ = public_repr  # blocks_class=, not the private field's name

    def _resolve(self, value: Any, what: str, *, want_class: bool = False) -> Any:
        """``value``, or what its dotted path names (imported now; the import system keeps it)."""
        if not isinstance(value, str):
            return value
        module_name, _, attribute = value.rpartition(".")
        found = getattr(importlib.import_module(module_name), attribute, None)
        if found is None or (want_class and not isinstance(found, type)):
            msg = f"family {self.name!r}: {what} {value!r} names no {'class' if want_class else 'function'}"
            raise TypeError(msg)
        return found

    def peer_pipeline_class_for(self, blocks_class_name: str) -> str:
        """The peer's pipeline class for one of the family's blocks classes (``peer_pipeline_classes``, else
        ``peer_pipeline_class``)."""
        return self.peer_pipeline_classes.get(blocks_class_name, self.peer_pipeline_class)

    def loader(self, kind: Literal["lora", "ip_adapter"]) -> type | None:
        """The family's ``lora_loader`` or ``ip_adapter_loader`` class, imported if given by its path."""
        value = self.lora_loader if kind == "lora" else self.ip_adapter_loader
        return self._resolve(value, f"{kind}_loader", want_class=True)

    @property
    def blocks_class(self) -> type:
        return self._resolve(self._blocks_class, "blocks_class", want_class=True)

    @property
    def variants(self) -> tuple[type, ...]:
        return tuple(self._resolve(variant, "variants", want_class=True) for variant in self._variants)

    @property
    def make_tiny_repo(self) -> Callable | None:
        return self._resolve(self._make_tiny_repo, "make_tiny_repo")

    @property
    def demo(self) -> Callable[[Path], Any] | None:
        return self._resolve(self._demo, "demo")

    @property
    def ships_tiny_repo(self) -> bool:
        """Whether the family has a tiny-repo builder (known without importing it)."""
        return self._make_tiny_repo is not None

    @property
    def ships_demo(self) -> bool:
        """Whether the family has a built-in scenario (known without importing it)."""
        return self._demo is not None

    @property
    def workflows(self) -> list[str]:
        """The named workflows of the family's blocks (empty when it names none): declared, else asked."""
        if self._workflows is not None:
            return list(self._workflows)
        blocks = self.blocks_class()
        try:
            return list(blocks.available_workflows)
        except NotImplementedError:
            return []

    @property
    def blocks_class_names(self) -> tuple[str, ...]:
        """The names of ``blocks_class`` and the variants, read without importing them."""
        return tuple(_short_name(value) for value in (self._blocks_class, *self._variants))

    @property
    def all_blocks_classes(self) -> tuple[type, ...]:
        return (self.blocks_class, *self.variants)

    def blocks_for(self, index: Mapping[str, Any]) -> type:
        """The blocks class for an index: by ``_blocks_class_name``, else ``choose_blocks``, else the default."""
        name = index.get("_blocks_class_name")
        for value in (self._blocks_class, *self._variants):
            if _short_name(value) == name:
                return self._resolve(value, "blocks_class", want_class=True)
        if self.choose_blocks is not None:
            return self.choose_blocks(index)
        return self.blocks_class


def _short_name(value: type | str) -> str:
    """A class's name, or the last part of its dotted path."""
    return value.rpartition(".")[2] if isinstance(value, str) else value.__name__


_registered: dict[str, BlockFamily] = {}
_discovered: dict[str, BlockFamily] | None = None


def register_family(family: BlockFamily) -> None:
    """Make a family known without an entry point (e.g. in a script or a test)."""
    if not isinstance(family, BlockFamily):
        msg = f"register_family expects a BlockFamily (got {type(family).__name__})"
        raise TypeError(msg)
    _registered[family.name] = family


def available_families() -> dict[str, BlockFamily]:
    """Every known family by name: the ``modular.blocks`` entry points plus registered ones."""
    global _discovered
    if _discovered is None:
        found = {}
        for point in entry_points(group=ENTRY_POINT_GROUP):
            check_siblings("modular", [point.module.partition(".")[0]])  # a user's blocks.py, say
            family = point.load()
            if not isinstance(family, BlockFamily):
                msg = f"entry point {point.name!r} in group {ENTRY_POINT_GROUP!r} must name a BlockFamily (got {type(family).__name__})"
                raise TypeError(msg)
            found[family.name] = family
        _discovered = found
    return {**_discovered, **_registered}


def family_for_index(index: dict, source: str) -> BlockFamily:
    """The family for an index file: by ``_blocks_class_name``, else by the classic ``_class_name``."""
    families = available_families().values()
    blocks_name = index.get("_blocks_class_name")
    class_name = index.get("_class_name")
    by_blocks = family_of_blocks(blocks_name) if blocks_name else None
    if by_blocks is not None:
        return by_blocks
    for family in families:
        if class_name in family.classic_pipelines:
            return family
    known = "; ".join(
        f"{f.name} ({', '.join([*f.classic_pipelines, *f.blocks_class_names])})"
        for f in sorted(families, key=lambda f: f.name)
    )
    wanted = blocks_name or class_name
    msg = (
        f"{source}: no installed family serves {wanted!r}; installed families: {known or 'none'}. Install or "
        "register a family (entry point group 'modular.blocks'), or build the blocks yourself and call "
        "blocks.init_pipeline(repo)"
    )
    raise ValueError(msg)


def family_of_blocks(blocks_class_name: str) -> BlockFamily | None:
    """The family one of whose blocks classes has this name, if any."""
    for family in available_families().values():
        if blocks_class_name in family.blocks_class_names:
            return family
    return None
