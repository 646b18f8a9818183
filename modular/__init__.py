"""The block framework: declare blocks, compose them, bind them to components, run them.

The public names of the project live here; each also lives in the package that owns it.
"""

from typing import TYPE_CHECKING

# quiet_imports installs its log filters before any module imports diffusers (importing components runs it).
from components import quiet_imports  # noqa: F401
from offload.lazy_exports import lazy_exports

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

if TYPE_CHECKING:
    from components import ComponentsManager, ComponentSpec, ConfigSpec

    from .block import ModularPipelineBlocks
    from .conditional import AutoPipelineBlocks, ConditionalPipelineBlocks
    from .families import BlockFamily, available_families, register_family
    from .loop import LoopSequentialPipelineBlocks
    from .params import InputParam, OutputParam
    from .pipeline import ModularPipeline
    from .remote import BlockSource
    from .sequential import SequentialPipelineBlocks
    from .state import BlockState, PipelineState

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "components": ("ComponentsManager", "ComponentSpec", "ConfigSpec"),
        ".block": ("ModularPipelineBlocks",),
        ".conditional": ("AutoPipelineBlocks", "ConditionalPipelineBlocks"),
        ".families": ("BlockFamily", "available_families", "register_family"),
        ".loop": ("LoopSequentialPipelineBlocks",),
        ".params": ("InputParam", "OutputParam"),
        ".pipeline": ("ModularPipeline",),
        ".remote": ("BlockSource",),
        ".sequential": ("SequentialPipelineBlocks",),
        ".state": ("BlockState", "PipelineState"),
    },
)

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
