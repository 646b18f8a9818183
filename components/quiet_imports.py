"""Drop three log lines that installing torchao on a CPU-only torch prints at every import of diffusers.

diffusers imports torchao whenever it is installed (it is a backend of the ``quantization`` extra). On a
torch build without CUDA, torchao logs that its CUDA kernels cannot load, torch logs that torchao registers
enums the old way, and diffusers logs that torchao's tensor classes moved. None of them concerns anything
this package does, and together they open every program's output, the main job's included. Each filter
drops only its own message; every other record of those loggers passes.
"""

from __future__ import annotations

import logging

__all__ = ["install_filters"]


_NOISE = {
    # torchao/__init__.py: a CUDA kernel library (_C_*.so) that a CPU build of torch cannot load.
    "torchao": ("Failed to load ",),
    # torch/utils/_pytree.py: torchao's enums registered with register_constant().
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
    # diffusers/quantizers/torchao: torchao's tensor classes, imported for checkpoints torchao serialized.
    "diffusers.quantizers.torchao.torchao_quantizer": ("Unable to import `torchao` Tensor objects",),
}


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def install_filters() -> None:
    """Add the filters (once; run when this module is imported, before anything imports diffusers)."""
    for name, fragments in _NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(fragments))


install_filters()
