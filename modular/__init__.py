"""The block framework: declare blocks, compose them, bind them to components, run them.

The public names of the project live here; each also lives in the package that owns it.
"""

from components import ComponentsManager, ComponentSpec, ConfigSpec
from modular.errors import (
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
from modular.families import BlockFamily, available_families, register_family
from modular.framework.block import ModularPipelineBlocks
from modular.framework.conditional import AutoPipelineBlocks, ConditionalPipelineBlocks
from modular.framework.loop import LoopSequentialPipelineBlocks
from modular.framework.params import InputParam, OutputParam
from modular.framework.sequential import SequentialPipelineBlocks
from modular.framework.state import BlockState, PipelineState
from modular.pipeline.pipeline import ModularPipeline
from modular.remote import BlockSource

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
