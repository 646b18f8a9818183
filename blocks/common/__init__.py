"""Steps that several families share."""

from .denoise_loop import TimestepLoopBlocks

__all__ = ["TimestepLoopBlocks"]
