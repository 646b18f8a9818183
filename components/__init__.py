"""Component specs, loading from repos, and the ComponentsManager registry."""

# _siblings first: it checks that `offload` is ours before anything imports it; quiet_imports installs
# its log filters before the modules below import diffusers.
from . import _siblings, errors, quiet_imports  # noqa: F401
from .errors import *  # noqa: F403  (every error; errors.__all__ is the one list of them)
from .importing import import_type, resolve_type_from_folder
from .load_id import decode_load_id, format_load_id, get_load_id, tag_load_id
from .manager import ComponentsManager
from .spec import ComponentSpec, ConfigSpec

__all__ = [
    *errors.__all__,
    "ComponentSpec",
    "ComponentsManager",
    "ConfigSpec",
    "decode_load_id",
    "format_load_id",
    "get_load_id",
    "import_type",
    "resolve_type_from_folder",
    "tag_load_id",
]
