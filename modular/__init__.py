"""The block framework: declare blocks, compose them, bind them to components, run them.

The public names of the project live here; each also lives in the package that owns it.
"""

# Before anything imports them: `components` and `offload` must be this distribution's.
from . import _siblings  # noqa: F401  # isort: skip
from components import ComponentsManager, ComponentSpec, ConfigSpec

from .block import ModularPipelineBlocks
from .conditional import AutoPipelineBlocks, ConditionalPipelineBlocks
from .errors import (
    BlockCodeError,
    BlockCompositionError,
    BlockRepoError,
    ComponentNotLoadedError,
    IndexFileError,
    InputTypeError,
    MissingInputError,
    SaveTargetInUseError,
    UnknownInputError,
    UnknownOutputError,
)
from .families import BlockFamily, available_families, register_family
from .loop import LoopSequentialPipelineBlocks
from .params import InputParam, OutputParam
from .pipeline import ModularPipeline
from .remote import BlockSource
from .sequential import SequentialPipelineBlocks
from .state import BlockState, PipelineState

__all__ = [
    "AutoPipelineBlocks",
    "BlockCodeError",
    "BlockCompositionError",
    "BlockFamily",
    "BlockRepoError",
    "BlockSource",
    "BlockState",
    "ComponentNotLoadedError",
    "ComponentSpec",
    "ComponentsManager",
    "ConditionalPipelineBlocks",
    "ConfigSpec",
    "IndexFileError",
    "InputParam",
    "InputTypeError",
    "LoopSequentialPipelineBlocks",
    "MissingInputError",
    "ModularPipeline",
    "ModularPipelineBlocks",
    "OutputParam",
    "PipelineState",
    "SaveTargetInUseError",
    "SequentialPipelineBlocks",
    "UnknownInputError",
    "UnknownOutputError",
    "available_families",
    "register_family",
]
