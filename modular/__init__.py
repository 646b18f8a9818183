"""The block framework: declare blocks, compose them, bind them to components, run them.

The public names of the project live here; each also lives in the package that owns it.
"""

# Before anything imports them: `components` and `offload` must be this distribution's.
from modular import _siblings  # noqa: F401

# isort: split
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

# quiet_imports installs its log filters before any module imports diffusers (importing components runs it).
from components import quiet_imports  # noqa: F401
from modular.errors import (
    BlockCodeError,
    BlockCompositionError,
    BlockRepoError,
    CallCancelled,
    ComponentNotLoadedError,
    IndexFileError,
    InputTypeError,
    MissingInputError,
    PreviewUnavailableError,
    SaveTargetInUseError,
    UnknownInputError,
    UnknownOutputError,
    UnknownWorkflowError,
)
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from components import ComponentsManager, ComponentSpec, ConfigSpec
    from modular.families import BlockFamily, available_families, register_family
    from modular.framework.block import ModularPipelineBlocks
    from modular.framework.conditional import AutoPipelineBlocks, ConditionalPipelineBlocks
    from modular.framework.loop import LoopSequentialPipelineBlocks
    from modular.framework.params import InputParam, OutputParam
    from modular.framework.sequential import SequentialPipelineBlocks
    from modular.framework.state import BlockState, PipelineState
    from modular.pipeline.pipeline import ModularPipeline
    from modular.remote import BlockSource
    from modular.watch.events import CancelToken, Preview, ProgressEvent

try:
    __version__ = version("modular-pipelines")
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "AutoPipelineBlocks",
    "BlockCodeError",
    "BlockCompositionError",
    "BlockFamily",
    "BlockRepoError",
    "BlockSource",
    "BlockState",
    "CallCancelled",
    "CancelToken",
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
    "Preview",
    "PreviewUnavailableError",
    "ProgressEvent",
    "SaveTargetInUseError",
    "SequentialPipelineBlocks",
    "UnknownInputError",
    "UnknownOutputError",
    "UnknownWorkflowError",
    "available_families",
    "register_family",
]
