"""Component specs, loading from repos, and the ComponentsManager registry."""

# _siblings first: it checks that `offload` is ours before anything imports it.
from components import _siblings  # noqa: F401

# isort: split
from typing import TYPE_CHECKING

# quiet_imports installs its log filters before any module of the package imports diffusers.
from components import errors, quiet_imports  # noqa: F401
from offload.lazy_exports import lazy_exports

from .errors import *  # noqa: F403  (every error; errors.__all__ is the one list of them)

if TYPE_CHECKING:
    from .importing import import_type, resolve_type_from_folder
    from .load_id import decode_load_id, format_load_id, get_load_id, tag_load_id
    from .manager import ComponentsManager
    from .spec import ComponentSpec, ConfigSpec

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

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
