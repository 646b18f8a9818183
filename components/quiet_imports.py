"""Drop the log lines that say nothing to this project's users: torchao's on a CPU-only torch, and two notices.

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
    # diffusers/guiders/guider_utils.py: said once per guider made, and every family makes its guider itself
    # (a component the user did not ask for); the guider classes are diffusers' own, documented there.
    "diffusers.guiders.guider_utils": ("Guiders are currently an experimental feature",),
    # transformers: an image processor that falls back to PIL without torchvision, as ours are meant to.
    "transformers.utils.import_utils": ("requires torchvision (not installed); falling back to",),
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
