"""Steps that several families share."""

from .decode import OUTPUT_TYPES, VaeDecodeStep
from .denoise_loop import TimestepLoopBlocks

__all__ = ["OUTPUT_TYPES", "TimestepLoopBlocks", "VaeDecodeStep"]
