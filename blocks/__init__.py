"""Pipeline families written with the modular framework, one subpackage per family."""

# Before any family imports them: `modular`, `components` and `offload` must be this distribution's.
from . import _siblings  # noqa: F401
