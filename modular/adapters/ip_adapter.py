"""IP-Adapters on a ModularPipeline: load one into the denoiser, set its scale, unload it.

Diffusers reads IP-Adapter files with pipeline mixins (``ModularIPAdapterMixin``, ``FluxIPAdapterMixin``)
written for a pipeline that owns its models and fetches its own files. Here the files come through the
project's repo loading (hub cache, revision, offline mode, safetensors unless ``use_pickle=True``), the
denoiser may be shared by several pipelines through a manager and placed by auto offload, and a failed load
must change nothing. So the family names its mixin (``BlockFamily.ip_adapter_loader``) and the mixin runs on
a stand-in (``_LoaderTarget``): first with a recorder in place of the denoiser, which keeps the state dicts
the mixin read and converted, so that they are checked before anything changes; then the denoiser's own
``_load_ip_adapter_weights`` installs them. The image encoder is a component loaded through the manager
(reused by load ID); the denoiser's retained host copy is refreshed after every change.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from components import ComponentSpec
from components.load_id import get_load_id
from components.model_info import IP_ADAPTER_ENCODER, IP_ADAPTER_SOURCE
from components.repo import describe, resolve_location
from components.weights import check_weight_file
from modular.adapters.lora import pipeline_label
from modular.adapters.model_changes import changes_models

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["IPAdapterError", "IPAdapterMethods"]

#: The components load_ip_adapter adds to the pipeline (the blocks' image prompt step reads them).
_ADDED_COMPONENTS = ("image_encoder", "feature_extractor")


class IPAdapterError(ValueError):
    """An IP-Adapter cannot be loaded, set or used as asked (the message names the file or the fix)."""


class _Recorder:
    """Stands in for the denoiser while the mixin reads a file: keeps the converted state dicts."""

    def __init__(self) -> None:
        self.state_dicts: list[dict[str, Any]] = []

    def _load_ip_adapter_weights(self, state_dicts: list[dict[str, Any]], **_: Any) -> None:
        self.state_dicts = list(state_dicts)

    def _load_ip_adapter_loras(self, state_dicts: list[dict[str, Any]]) -> dict:
        return {}


def _target(loader: type, denoiser_name: str, denoiser: Any) -> Any:
    """A stand-in pipeline the mixin's methods run on: it holds the denoiser under its component name only
    (no ``image_encoder`` attribute, so the mixin leaves the image encoder to us)."""
    target = type("_LoaderTarget", (loader,), {"unet_name": denoiser_name})()
    setattr(target, denoiser_name, denoiser)
    return target


def _as_list(value: str | Sequence[str], count: int, name: str) -> list[str]:
    values = [value] if isinstance(value, str | os.PathLike) else list(value)
    if len(values) == 1:
        values = values * count
    if len(values) != count or not all(isinstance(v, str | os.PathLike) for v in values):
        msg = f"load_ip_adapter: {name} must be a str or a list of {count} str (got {value!r})"
        raise TypeError(msg)
    return [os.fspath(v) for v in values]


@attrs.frozen
class _Snapshot:
    """What loading or unloading an IP-Adapter changes on a denoiser, to put back after a failure."""

    processors: dict[str, Any]
    projection: Any
    hid_dim_type: Any
    had_projection: bool  # a Flux transformer has no encoder_hid_proj before its first IP-Adapter

    @classmethod
    def of(cls, denoiser: Any) -> _Snapshot:
        projection = getattr(denoiser, "encoder_hid_proj", None)
        had = hasattr(denoiser, "encoder_hid_proj")
        return cls(
            dict(denoiser.attn_processors), projection, denoiser.config.get("encoder_hid_dim_type"), had
        )

    def restore(self, denoiser: Any) -> None:
        denoiser.set_attn_processor(dict(self.processors))
        if self.had_projection:
            denoiser.encoder_hid_proj = self.projection
        elif hasattr(denoiser, "encoder_hid_proj"):
            del denoiser.encoder_hid_proj
        if "encoder_hid_dim_type" in denoiser.config:
            denoiser.config.encoder_hid_dim_type = self.hid_dim_type


def denoiser_names(pipe: ModularPipeline) -> list[str]:
    """The components an IP-Adapter call changes: the loaded model(s) that take IP-Adapter weights."""
    return [name for name, obj in pipe._components.items() if hasattr(obj, "_load_ip_adapter_weights")]


class IPAdapterMethods:
    """``load_ip_adapter``, ``set_ip_adapter_scale`` and ``unload_ip_adapter`` of ``ModularPipeline``."""

    @changes_models(denoiser_names)
    def load_ip_adapter(
        self,
        pretrained_model_name_or_path: str | os.PathLike,
        subfolder: str | Sequence[str],
        weight_name: str | Sequence[str],
        image_encoder_folder: str | None = "image_encoder",
        *,
        image_encoder_repo: str | os.PathLike | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        local_files_only: bool = False,
        cache_dir: str | os.PathLike | None = None,
        use_pickle: bool = False,
        torch_dtype: torch.dtype | None = None,
    ) -> None:
        """Load IP-Adapter weights into the denoiser, and the image encoder as a component.

        Args:
            pretrained_model_name_or_path: A local folder or a hub repo id.
            subfolder: The folder in the repo that holds the weight file (``""`` for the root); a list with
                ``weight_name`` loads several adapters at once.
            weight_name: The weight file, e.g. ``"ip-adapter_sd15.safetensors"``.
            image_encoder_folder: Where the CLIP vision encoder is: a folder name is looked up inside
                ``subfolder``, a path with ``/`` from the repo root (as diffusers' ``load_ip_adapter``);
                ``None`` loads none (then calls pass ``ip_adapter_image_embeds``).
            image_encoder_repo: Another repo to take the image encoder from (``image_encoder_folder`` is then
                a folder of that repo, ``""`` or ``None`` for its root).
            revision, token, local_files_only, cache_dir: As for ``load_components``.
            use_pickle: Allow ``.bin``/``.pt`` weight files, which can run code when read.
            torch_dtype: The image encoder's dtype (default: the denoiser's).

        The adapter goes into the denoiser object, so every pipeline sharing it sees it. The image encoder
        is registered in the manager and shared by load ID like any component. A feature extractor sized
        for the image encoder is made when the pipeline has none. Nothing changes when this raises.

        Raises:
            IPAdapterError: the family takes no IP-Adapter, the pipeline's blocks take no image prompt, the
                file lacks its image projection or does not fit the denoiser.
            MissingComponentFileError, PickleWeightsError, CorruptWeightsError, RepoNotFoundError...: as for
                ``load_components``.
        """
        pipe: ModularPipeline = self  # type: ignore[assignment]  # only ModularPipeline has these methods
        loader, denoiser_name, denoiser = _loader_and_denoiser(pipe, "load_ip_adapter")
        if "ip_adapter_image_embeds" not in pipe._plans.params(pipe._blocks):
            msg = (
                f"load_ip_adapter: the blocks of this pipeline ({pipe.blocks_class_name}) take no image prompt "
                "(no ip_adapter step); build the pipeline from the family's full blocks"
            )
            raise IPAdapterError(msg)
        repo = os.fspath(pretrained_model_name_or_path)
        names = [weight_name] if isinstance(weight_name, str) else list(weight_name)
        subfolders = _as_list(subfolder, len(names), "subfolder")
        names = _as_list(names, len(subfolders), "weight_name")
        source = {"token": token, "local_files_only": local_files_only, "cache_dir": cache_dir}
        roots = [
            _weight_root(repo, sub, name, revision, use_pickle, source)
            for sub, name in zip(subfolders, names)
        ]
        state_dicts = _read(loader, denoiser_name, roots, subfolders, names)
        for state_dict, sub, name in zip(state_dicts, subfolders, names):
            _check_state_dict(state_dict, describe(repo, sub, None, revision), name, denoiser)
        encoder = None
        cm = pipe._components_manager
        registered_before = set(cm.components) if cm is not None else set()
        if image_encoder_folder is not None or image_encoder_repo is not None:
            encoder_spec = _image_encoder_spec(
                pipe, repo, subfolders[0], image_encoder_folder, image_encoder_repo
            )
            options: dict[str, Any] = {**source, "revision": revision, "use_pickle": use_pickle}
            options["torch_dtype"] = torch_dtype or denoiser.dtype
            encoder = (
                encoder_spec.load(**options)
                if cm is None
                else cm.get_or_load(encoder_spec, pipe._collection, **options)
            )
        try:
            _change_denoiser(pipe, denoiser, lambda: denoiser._load_ip_adapter_weights(state_dicts))
        except Exception as error:
            encoder_id = cm.get_id(encoder) if cm is not None and encoder is not None else None
            if cm is not None and encoder_id is not None and encoder_id not in registered_before:
                cm.remove(encoder_id)
            msg = f"load_ip_adapter: {names} from {repo!r} does not fit {denoiser_name!r} ({error}); use an IP-Adapter made for this model"
            raise IPAdapterError(msg) from error
        if encoder is not None:
            pipe._specs["image_encoder"] = encoder_spec
            pipe._components["image_encoder"] = encoder
            # What the manager's table names as this adapter's image encoder (its id there, else its load ID).
            encoder_id = cm.get_id(encoder) if cm is not None else None
            setattr(denoiser, IP_ADAPTER_ENCODER, encoder_id or get_load_id(encoder))
        elif hasattr(denoiser, IP_ADAPTER_ENCODER):
            delattr(
                denoiser, IP_ADAPTER_ENCODER
            )  # this adapter has none: a pipeline sharing it must not look
        # Who loaded it: a pipeline sharing the denoiser finds the adapter there and says where it came from.
        setattr(denoiser, IP_ADAPTER_SOURCE, pipeline_label(pipe))
        if pipe._components.get("feature_extractor") is None:
            _add_feature_extractor(pipe, encoder)
        pipe._plans.forget()

    @changes_models(denoiser_names)
    def set_ip_adapter_scale(self, scale: Any) -> None:
        """Set how strongly the image prompt counts, as diffusers' ``set_ip_adapter_scale`` of the family.

        ``scale`` is a number for every layer; a UNet also takes per-block dicts such as
        ``{"down": {"block_2": [0.0, 1.0]}, "up": {"block_0": [0.0, 1.0, 0.0]}}``, and a list of those with one
        per loaded adapter; Flux a list of numbers per transformer block. Nothing changes when this raises.

        Raises:
            IPAdapterError: no IP-Adapter is loaded, or ``scale`` does not fit the loaded adapters.
        """
        pipe: ModularPipeline = self  # type: ignore[assignment]  # only ModularPipeline has these methods
        loader, denoiser_name, denoiser = _loader_and_denoiser(pipe, "set_ip_adapter_scale")
        processors = _ip_processors(denoiser)
        if not processors:
            msg = f"set_ip_adapter_scale: no IP-Adapter is loaded into {denoiser_name!r}; call load_ip_adapter(...) first"
            raise IPAdapterError(msg)
        before = {name: _copy_scale(proc.scale) for name, proc in processors.items()}
        try:
            loader.set_ip_adapter_scale(_target(loader, denoiser_name, denoiser), scale)
        except Exception as error:
            for name, proc in processors.items():
                proc.scale = before[name]
            msg = f"set_ip_adapter_scale: scale {scale!r} does not fit the loaded IP-Adapter(s) ({error})"
            raise IPAdapterError(msg) from error

    @changes_models(denoiser_names)
    def unload_ip_adapter(self) -> None:
        """Remove the IP-Adapter from the denoiser (for every pipeline sharing it) and drop this pipeline's
        image encoder and feature extractor. The image encoder stays in the manager, where other pipelines
        may use it (``components_manager.remove(id)`` frees it). A no-op when none is loaded."""
        pipe: ModularPipeline = self  # type: ignore[assignment]  # only ModularPipeline has these methods
        loader, denoiser_name, denoiser = _loader_and_denoiser(pipe, "unload_ip_adapter")
        if _ip_processors(denoiser):
            _change_denoiser(
                pipe, denoiser, lambda: loader.unload_ip_adapter(_target(loader, denoiser_name, denoiser))
            )
        for record in (IP_ADAPTER_ENCODER, IP_ADAPTER_SOURCE):
            if hasattr(denoiser, record):
                delattr(denoiser, record)
        declared = {spec.name for spec in pipe._blocks.expected_components}
        for name in _ADDED_COMPONENTS:
            if name in declared:
                pipe._components[name] = None
            else:  # added by load_ip_adapter, as a classic pipeline registers them
                pipe._components.pop(name, None)
                pipe._specs.pop(name, None)
        pipe._plans.forget()


def _loader_and_denoiser(pipe: ModularPipeline, caller: str) -> tuple[Any, str, Any]:
    """The family's IP-Adapter mixin, and the loaded component that takes IP-Adapter weights."""
    from modular.families import family_of_blocks

    family = family_of_blocks(pipe.blocks_class_name)
    loader = None if family is None else family.loader("ip_adapter")
    if loader is None:
        which = "no known family" if family is None else f"family {family.name!r}"
        msg = f"{caller}: {pipe.blocks_class_name} belongs to {which}, which takes no IP-Adapter"
        raise IPAdapterError(msg)
    for name, obj in pipe._components.items():
        if hasattr(obj, "_load_ip_adapter_weights"):
            return loader, name, obj
    msg = (
        f"{caller}: the model that takes IP-Adapter weights is not loaded; call pipe.load_components() first"
    )
    raise IPAdapterError(msg)


def _weight_root(
    repo: str,
    subfolder: str,
    weight_name: str,
    revision: str | None,
    use_pickle: bool,
    source: dict[str, Any],
) -> str:
    """The local root (a folder, or a hub snapshot) holding ``subfolder/weight_name``, the file checked."""
    location = resolve_location(repo, subfolder, None, revision, use_pickle=use_pickle, **source)
    where = describe(repo, subfolder, None, revision)
    check_weight_file(location.folder, weight_name, use_pickle=use_pickle, what="IP-Adapter", where=where)
    return location.root


def _read(
    loader: Any, denoiser_name: str, roots: list[str], subfolders: list[str], names: list[str]
) -> list[dict]:
    """The state dicts as the family's mixin reads and converts them (``{"image_proj": ..., "ip_adapter": ...}``)."""
    state_dicts = []
    for root, subfolder, name in zip(roots, subfolders, names):
        recorder = _Recorder()
        # A local root: the mixin reads the file we found and checked, and fetches nothing.
        loader.load_ip_adapter(
            _target(loader, denoiser_name, recorder),
            pretrained_model_name_or_path_or_dict=root,
            subfolder=subfolder,
            weight_name=name,
            local_files_only=True,
        )
        state_dicts.extend(recorder.state_dicts)
    return state_dicts


def _check_state_dict(state_dict: dict, where: str, weight_name: str, denoiser: Any) -> None:
    for part, what in (("image_proj", "image projection"), ("ip_adapter", "attention weights")):
        if not state_dict.get(part):
            msg = (
                f"{where}: {weight_name!r} has no IP-Adapter {what} (no '{part}.*' keys); it is not an "
                "IP-Adapter file, or it is damaged. Use the IP-Adapter's own weight file."
            )
            raise IPAdapterError(msg)
    if getattr(denoiser, "_load_ip_adapter_loras", None) and denoiser._load_ip_adapter_loras([state_dict]):
        msg = f"{where}: {weight_name!r} carries LoRA weights (an IP-Adapter FaceID); these are not supported"
        raise IPAdapterError(msg)


def _image_encoder_spec(
    pipe: ModularPipeline, repo: str, subfolder: str, folder: str | None, other_repo: str | os.PathLike | None
) -> ComponentSpec:
    """The image encoder's spec: the pipeline's ``image_encoder`` spec at the adapter's encoder folder."""
    if other_repo is not None:
        repo, where = os.fspath(other_repo), folder or ""
    elif folder is not None and "/" not in folder:
        where = (
            f"{subfolder}/{folder}" if subfolder else folder
        )  # diffusers' rule: a bare name is in subfolder
    else:
        where = folder or ""
    from transformers import CLIPVisionModelWithProjection

    return ComponentSpec(
        "image_encoder", CLIPVisionModelWithProjection, pretrained_model_name_or_path=repo, subfolder=where
    )


def _change_denoiser(pipe: ModularPipeline, denoiser: Any, change: Any) -> None:
    """Run ``change`` on the denoiser's weights; undo it if it raises; keep offload's host copy true."""
    cm = pipe._components_manager
    denoiser_id = cm.get_id(denoiser) if cm is not None else None
    # One engine per device: the denoiser's is the one whose hook it carries.
    engines = cm.offload_engines if cm is not None else []
    engine = next((e for e in engines if denoiser_id is not None and e.has_hook(denoiser_id)), None)
    if engine is not None and denoiser_id is not None and engine.is_resident(denoiser_id):
        # On the host while it changes: new layers then join the host copy, none is left on the device alone.
        engine.evict(denoiser_id)
    snapshot = _Snapshot.of(denoiser)
    try:
        change()
    except BaseException:
        snapshot.restore(denoiser)
        raise
    finally:
        if denoiser_id is not None:
            cm.refresh_host_copy(denoiser_id, edited=False)  # type: ignore[union-attr]  # adapter layers only


def _add_feature_extractor(pipe: ModularPipeline, encoder: Any) -> None:
    """A CLIP image processor sized for the image encoder (224 without one), as diffusers makes it."""
    from transformers import CLIPImageProcessor

    size = encoder.config.image_size if encoder is not None else 224
    processor = CLIPImageProcessor(size=size, crop_size=size)
    pipe._specs["feature_extractor"] = ComponentSpec(
        "feature_extractor",
        CLIPImageProcessor,
        config={"size": size, "crop_size": size},
        default_creation_method="from_config",
    )
    pipe._components["feature_extractor"] = processor
    cm = pipe._components_manager
    if cm is not None:
        # The pipeline's own, as its from-config components are: dropped from the manager with the pipeline.
        cm.add("feature_extractor", processor, collection=pipe._collection, owner=pipe)


def _ip_processors(denoiser: Any) -> dict[str, Any]:
    """The denoiser's attention processors that carry IP-Adapter layers (``to_k_ip``)."""
    return {name: proc for name, proc in denoiser.attn_processors.items() if hasattr(proc, "to_k_ip")}


def _copy_scale(scale: Any) -> Any:
    return list(scale) if isinstance(scale, list) else scale
