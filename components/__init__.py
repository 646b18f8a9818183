"""Component specs, loading from repos, and the ComponentsManager registry."""

from . import quiet_imports  # noqa: F401  (first: its filters must be in place before diffusers is imported)
from .errors import (
    ComponentLoadError,
    ComponentNotFoundError,
    CorruptWeightsError,
    MissingComponentFileError,
    PickleWeightsError,
    PipelineTypeError,
    RemoteCodeError,
    RepoNotFoundError,
    RevisionNotFoundError,
    SubfolderNotFoundError,
    SubfolderOutsideRepoError,
    VariantNotFoundError,
)
from .importing import import_type, resolve_type_from_folder
from .load_id import decode_load_id, format_load_id, get_load_id, tag_load_id
from .manager import ComponentsManager
from .spec import ComponentSpec, ConfigSpec

__all__ = [
    "ComponentLoadError",
    "ComponentNotFoundError",
    "ComponentSpec",
    "ComponentsManager",
    "ConfigSpec",
    "CorruptWeightsError",
    "MissingComponentFileError",
    "PickleWeightsError",
    "PipelineTypeError",
    "RemoteCodeError",
    "RepoNotFoundError",
    "RevisionNotFoundError",
    "SubfolderNotFoundError",
    "SubfolderOutsideRepoError",
    "VariantNotFoundError",
    "decode_load_id",
    "format_load_id",
    "get_load_id",
    "import_type",
    "resolve_type_from_folder",
    "tag_load_id",
]
