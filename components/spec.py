"""ComponentSpec and ConfigSpec: what a block needs, and how to make it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from .errors import ComponentLoadError, RemoteCodeError
from .importing import declared_remote_code, import_type, remote_code_refused, resolve_type_from_folder
from .library_bars import library_bars_hidden
from .load_id import (
    LOAD_ID_FIELDS,
    NULL_LOAD_ID,
    canonical_repo,
    decode_load_id,
    format_load_id,
    get_load_id,
    tag_load_id,
)
from .load_kwargs import LOAD_OPTIONS, PASSED_ON_OPTIONS, split_load_kwargs
from .loadable_type import check_loadable_type
from .public_repr import public_repr
from .quantization import resolve_quantization
from .remote_code import check_consent, consent_covers, refusal_hint
from .repo import Location, describe, resolve_location
from .single_file import SINGLE_FILE_SUFFIXES, is_single_file, load_single_file
from .weights import check_config, check_weights, follows_auto_map, loads_weights

__all__ = ["LOAD_OPTIONS", "ComponentSpec", "ConfigSpec", "check_loadable_type", "normalize_dtype"]

logger = logging.getLogger(__name__)

CREATION_METHODS = ("from_pretrained", "from_config")


def normalize_dtype(dtype: Any = None, torch_dtype: Any = None) -> torch.dtype | None:
    """Merges the ``dtype``/``torch_dtype`` spellings into one ``torch.dtype`` (or ``None``).

    Accepts a ``torch.dtype`` or its name (``"float16"``, ``"torch.float16"``).
    """
    if (
        dtype is not None
        and torch_dtype is not None
        and normalize_dtype(dtype) != normalize_dtype(torch_dtype)
    ):
        msg = f"dtype ({dtype!r}) and torch_dtype ({torch_dtype!r}) disagree; pass only one of them."
        raise ValueError(msg)
    value = dtype if dtype is not None else torch_dtype
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        resolved = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(resolved, torch.dtype):
            return resolved
    msg = f"dtype must be a torch.dtype or its name such as 'float16' (got {value!r})."
    raise TypeError(msg)


def _check_part(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        msg = f"ComponentSpec.{attribute.name} must be a str or None (got {value!r} that is a {type(value)})."
        raise TypeError(msg)
    if "|" in value:
        msg = f"ComponentSpec.{attribute.name} must not contain '|', the load-ID separator (got {value!r})."
        raise ValueError(msg)
    if value == NULL_LOAD_ID:
        msg = f"ComponentSpec.{attribute.name} must not be 'null', which load IDs use for a missing part."
        raise ValueError(msg)


def _check_name(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not value.isidentifier():
        msg = f"ComponentSpec.name must be a Python identifier such as 'unet' (got {value!r})."
        raise ValueError(msg)


def _check_type_hint(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None or isinstance(value, type):
        return
    if isinstance(value, str) and "." in value and all(part.isidentifier() for part in value.split(".")):
        return
    msg = (
        f"ComponentSpec.type_hint must be a class or None, or the class's dotted path such as "
        f"'diffusers.AutoencoderKL' (got {value!r} that is a {type(value)})."
    )
    raise TypeError(msg)


def _to_path_str(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _none_to_empty(value: str | None) -> str:
    # A named converter rather than attrs.converters.default_if_none(""): mypy's attrs plugin reads
    # only named functions, types and lambdas as converters.
    return "" if value is None else value


@attrs.frozen(init=False, eq=False, repr=False)
class ComponentSpec:
    """What a block needs under one name, and how to make it.

    ``repo=`` is accepted as an alias of ``pretrained_model_name_or_path``. Specs are frozen: change one with
    ``attrs.evolve``. Two specs are equal when name, load ID and creation method are.

    Attributes:
        name: The component's name in a pipeline, e.g. ``"unet"``.
        type_hint: Its class, or the class's dotted path (``"diffusers.FluxTransformer2DModel"``), imported on
            first use: a block module that names its models by path imports none of them until a pipeline is
            composed, loaded or checked. ``None`` lets ``load`` read the class from the repo's config files.
        description: One line for docs.
        config: Config for ``create`` (components made with ``from_config``).
        pretrained_model_name_or_path: Local folder or hub repo id.
        subfolder: Folder inside the repo (``""`` for the root).
        variant: Weight variant, e.g. ``"fp16"``.
        revision: Hub branch, tag or commit.
        default_creation_method: ``"from_pretrained"`` (load weights) or ``"from_config"`` (build).
    """

    name: str = attrs.field(validator=_check_name)
    _type_hint: type | str | None = attrs.field(default=None, validator=_check_type_hint, alias="type_hint")
    description: str | None = attrs.field(default=None)
    config: dict[str, Any] | None = attrs.field(default=None, converter=attrs.converters.optional(dict))
    pretrained_model_name_or_path: str | None = attrs.field(
        default=None, converter=_to_path_str, validator=_check_part
    )
    subfolder: str = attrs.field(default="", converter=_none_to_empty, validator=_check_part)
    variant: str | None = attrs.field(default=None, validator=_check_part)
    revision: str | None = attrs.field(default=None, validator=_check_part)
    default_creation_method: str = attrs.field(
        default="from_pretrained", validator=attrs.validators.in_(CREATION_METHODS)
    )

    __repr__ = public_repr  # type_hint=, not the private field's name

    def __init__(
        self,
        name: str,
        type_hint: type | str | None = None,
        description: str | None = None,
        config: dict[str, Any] | None = None,
        pretrained_model_name_or_path: str | os.PathLike | None = None,
        subfolder: str | None = "",
        variant: str | None = None,
        revision: str | None = None,
        default_creation_method: str = "from_pretrained",
        *,
        repo: str | os.PathLike | None = None,
    ) -> None:
        if repo is not None:
            if pretrained_model_name_or_path is not None and _to_path_str(
                pretrained_model_name_or_path
            ) != _to_path_str(repo):
                msg = (
                    f"ComponentSpec {name!r}: repo ({repo!r}) and pretrained_model_name_or_path "
                    f"({pretrained_model_name_or_path!r}) disagree; repo is an alias, pass one of them."
                )
                raise ValueError(msg)
            pretrained_model_name_or_path = repo
        self.__attrs_init__(
            name,
            type_hint,
            description,
            config,
            pretrained_model_name_or_path,
            subfolder,
            variant,
            revision,
            default_creation_method,
        )

    @property
    def type_hint(self) -> type | None:
        """The component's class (imported now if the spec names it by path, then kept); ``None`` if unknown."""
        value = self._type_hint
        if isinstance(value, str):
            module_name, _, class_name = value.rpartition(".")
            try:  # the path is the program's own code, not a repo's: any module may be named
                value = import_type(module_name, class_name, trust_remote_code=True)
            except ComponentLoadError as error:
                msg = f"ComponentSpec {self.name!r}: type_hint {value!r} names no class. {error}"
                raise ComponentLoadError(msg) from error
            object.__setattr__(self, "_type_hint", value)  # a cache: equality and hashing ignore the class
        return value

    @property
    def repo(self) -> str | None:
        """Alias of ``pretrained_model_name_or_path``."""
        return self.pretrained_model_name_or_path

    @property
    def load_id(self) -> str:
        """``"<repo>|<subfolder>|<variant>|<revision>"``, or ``"null"`` for a ``from_config`` spec.

        A local repo is named by its resolved real path (``components.load_id.canonical_repo``), however the spec
        spells it; a hub repo id as it is.
        """
        if self.default_creation_method == "from_config":
            return NULL_LOAD_ID
        repo = self.pretrained_model_name_or_path
        return format_load_id(
            None if repo is None else canonical_repo(repo), self.subfolder, self.variant, self.revision
        )

    @staticmethod
    def decode_load_id(load_id: str) -> dict[str, str | None]:
        """Splits a load ID into ``pretrained_model_name_or_path``, ``subfolder``, ``variant``, ``revision``."""
        return decode_load_id(load_id)

    @classmethod
    def loading_fields(cls) -> list[str]:
        """The fields that make up a load ID, in order."""
        return list(LOAD_ID_FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ComponentSpec):
            return NotImplemented
        return (self.name, self.load_id, self.default_creation_method) == (
            other.name,
            other.load_id,
            other.default_creation_method,
        )

    def __hash__(self) -> int:
        return hash((self.name, self.load_id, self.default_creation_method))

    @classmethod
    def from_component(cls, name: str, component: Any) -> ComponentSpec:
        """Describes an existing object: a loaded one by its load ID, a config object by its config.

        Raises:
            ValueError: ``component`` is a module (or other object) without a load ID and without a config
                to rebuild it from.
        """
        load_id = get_load_id(component)
        if load_id is not None and load_id != NULL_LOAD_ID:
            fields = decode_load_id(load_id)
            return cls(
                name,
                type(component),
                pretrained_model_name_or_path=fields["pretrained_model_name_or_path"],
                subfolder=fields["subfolder"],
                variant=fields["variant"],
                revision=fields["revision"],
                default_creation_method="from_pretrained",
            )
        from diffusers.configuration_utils import ConfigMixin

        if isinstance(component, ConfigMixin) and not isinstance(component, torch.nn.Module):
            return cls(
                name, type(component), config=dict(component.config), default_creation_method="from_config"
            )
        msg = (
            f"Cannot describe component {name!r} ({type(component).__name__}): it carries no load ID and is not a "
            f"config object (such as a scheduler) that can be rebuilt from its config. Load it with "
            f"ComponentSpec.load(), or tag it with components.tag_load_id(obj, '<repo>|<subfolder>|<variant>|<revision>')."
        )
        raise ValueError(msg)

    def create(self, config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """Builds the component from a config (``from_config``), tagged with load ID ``"null"``.

        Args:
            config: Values that override the spec's own ``config``.
            **kwargs: Passed to ``from_config`` (or to the constructor of a class without it).
        """
        if self.type_hint is None:
            msg = f"ComponentSpec {self.name!r} has no type_hint, which create() needs to build the object; set one."
            raise ValueError(msg)
        from diffusers.configuration_utils import ConfigMixin

        merged = {**(self.config or {}), **(config or {})}
        maker: Any = self.type_hint  # any class: from_config is looked up on ConfigMixin subclasses only
        if issubclass(maker, ConfigMixin):
            component = maker.from_config(merged, **kwargs)
        else:
            component = maker(**merged, **kwargs)
        tag_load_id(component, NULL_LOAD_ID)
        return component

    def load(self, **kwargs: Any) -> Any:
        """Loads the component with ``from_pretrained`` from a local folder or a hub repo id.

        Args:
            **kwargs: Loading-field overrides (``pretrained_model_name_or_path``/``repo``, ``subfolder``,
                ``variant``, ``revision``) and load options: ``torch_dtype``/``dtype``,
                ``quantization_config`` (a per-model config of the model's library, or a
                ``PipelineQuantizationConfig`` resolved by this spec's name), ``token``, ``local_files_only``,
                ``cache_dir``, ``use_pickle`` (opt in to .bin/.pt/.ckpt weights), ``trust_remote_code``
                (``True`` for this spec's repo, or the repos whose code may run: ``components.remote_code``),
                ``device_map``, ``low_cpu_mem_usage``, ``config`` (the config folder or repo of a spec whose
                repo is one checkpoint file, which loads with ``from_single_file``: ``components/single_file.py``).

        Returns:
            The object, tagged with its load ID. The spec itself is not changed.

        Raises:
            TypeError: an unknown keyword (the message names the closest accepted one).
            ValueError: no repo to load from, or ``repo`` and ``pretrained_model_name_or_path`` disagree.
            ComponentLoadError: (and its subclasses) the repo, subfolder, variant, revision, config or weights
                are missing, corrupt, or refused; the subfolder leaves the repo; the type is a whole pipeline
                (PipelineTypeError) or has no ``from_pretrained``; the quantization config does not fit the
                model (QuantizationConfigError) or its backend is not installed (QuantizationBackendError).
        """
        with library_bars_hidden():  # transformers' "Loading weights" bar on every model, unless asked for
            return self._load(kwargs)

    def _load(self, kwargs: dict[str, Any]) -> Any:
        fields, options = split_load_kwargs(kwargs, f"ComponentSpec.load() for {self.name!r}")
        check_consent(options.get("trust_remote_code", False), f"ComponentSpec.load() for {self.name!r}")
        spec = attrs.evolve(self, **fields) if fields else self
        dtype = normalize_dtype(options.get("dtype"), options.get("torch_dtype"))
        if is_single_file(spec.pretrained_model_name_or_path):
            if spec.type_hint is not None:
                quantization = resolve_quantization(
                    spec.name, spec.type_hint, options.get("quantization_config")
                )
                options = {**options, "quantization_config": quantization}
            return load_single_file(spec, dtype, options)
        if options.get("config") is not None:
            msg = (
                f"ComponentSpec.load() for {self.name!r}: config= names the config of a single checkpoint file, "
                f"but {spec.pretrained_model_name_or_path!r} is not a local checkpoint file "
                f"({', '.join(SINGLE_FILE_SUFFIXES)}); drop config=, or point the spec at the file."
            )
            raise ValueError(msg)
        location, type_hint = spec._resolve(options)
        quantization = resolve_quantization(spec.name, type_hint, options.get("quantization_config"))
        options = {**options, "quantization_config": quantization}
        logger.debug("Loading %s from %s as %s", spec.name, location.root, type_hint)
        loader: Any = type_hint  # any class with from_pretrained (diffusers, transformers, remote code)
        component = loader.from_pretrained(
            location.root, **spec._pretrained_options(type_hint, dtype, options)
        )
        tag_load_id(component, spec.load_id)
        return component

    def resolve_quantization(self, **kwargs: Any) -> Any:
        """The quantization config this spec's model loads with for the keywords of a ``load`` call.

        ``quantization_config`` resolved for this component (``components.quantization.resolve_quantization``:
        a ``PipelineQuantizationConfig`` picks its entry, a per-model config is checked against the model's
        library and backend); the class is read from the repo when the spec has no ``type_hint``.
        """
        fields, options = split_load_kwargs(kwargs, f"ComponentSpec.load() for {self.name!r}")
        config = options.get("quantization_config")
        if config is None:
            return None
        spec = attrs.evolve(self, **fields) if fields else self
        type_hint = spec.type_hint if spec.type_hint is not None else spec._resolve(options)[1]
        return resolve_quantization(spec.name, type_hint, config)

    def _resolve(self, options: Mapping[str, Any]) -> tuple[Location, type]:
        """The component's files and the class to load them with, both checked before anything is loaded."""
        repo = self.pretrained_model_name_or_path
        if repo is None:
            msg = (
                f"ComponentSpec {self.name!r} has no repo to load from. Set pretrained_model_name_or_path (or "
                f"repo=) on the spec, or pass it to load()."
            )
            raise ValueError(msg)
        use_pickle = bool(options.get("use_pickle", False))
        where = describe(repo, self.subfolder, self.variant, self.revision)
        if self.type_hint is not None:
            check_loadable_type(self.name, self.type_hint, where)
        location = resolve_location(
            repo,
            self.subfolder,
            self.variant,
            self.revision,
            token=options.get("token"),
            local_files_only=bool(options.get("local_files_only", False)),
            cache_dir=options.get("cache_dir"),
            use_pickle=use_pickle,
        )
        consent = options.get("trust_remote_code")
        trusted = consent_covers(consent, repo)
        refusal = refusal_hint(consent, repo)
        type_hint = self.type_hint
        if type_hint is None:
            type_hint, _ = resolve_type_from_folder(location.folder, where, trusted, refusal)
            check_loadable_type(self.name, type_hint, where)
        elif not trusted and follows_auto_map(type_hint):
            # An auto class would run the folder's own code; refused here with the repo named.
            auto_map = declared_remote_code(location.folder)
            if auto_map is not None:
                raise RemoteCodeError(remote_code_refused(where, auto_map, refusal))
        # Every type is checked, whatever its loader: the config it reads, and the weight files beside it.
        check_config(location.folder, where, type_hint)
        check_weights(
            location.folder, where, self.variant, use_pickle, needs_weights=loads_weights(type_hint)
        )
        return location, type_hint

    def _pretrained_options(
        self, type_hint: type, dtype: torch.dtype | None, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The keywords of ``type_hint.from_pretrained`` for this spec and these load options."""
        kwargs: dict[str, Any] = {}
        if self.subfolder:
            kwargs["subfolder"] = self.subfolder
        # Models take weights options; tokenizers and schedulers would store unknown ones in their config.
        if loads_weights(type_hint):
            if self.variant is not None:
                kwargs["variant"] = self.variant
            if dtype is not None:
                kwargs["dtype"] = dtype
            if not options.get("use_pickle", False):
                kwargs["use_safetensors"] = True
            kwargs.update({key: options[key] for key in PASSED_ON_OPTIONS if options.get(key) is not None})
        if consent_covers(options.get("trust_remote_code"), self.pretrained_model_name_or_path):
            kwargs["trust_remote_code"] = True
        return kwargs


@attrs.frozen
class ConfigSpec:
    """A pipeline-level value, stored in the pipeline config and in the saved index.

    Attributes:
        name: The value's name, e.g. ``"requires_safety_checker"``.
        default: Its value when the repo does not set one.
        description: One line for docs.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    default: Any
    description: str | None = None
