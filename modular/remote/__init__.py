"""Blocks shared as repos: a block's code and ``modular_config.json``, in the peer's layout.

``ModularPipelineBlocks.from_pretrained(repo, trust_remote_code=True)`` loads one (``load.py``) from a local
folder or a pinned hub revision (``source.py``), running its code with the peer's
``diffusers.modular_pipelines`` names mapped to ours (``peer_imports.py``, ``code.py``);
``block.save_pretrained(folder)`` writes one (``save.py``).
"""

from .load import load_block
from .peer_imports import PEER_NAMES, PeerImportError
from .save import save_block
from .source import CONFIG_NAME, BlockSource

__all__ = ["CONFIG_NAME", "PEER_NAMES", "BlockSource", "PeerImportError", "load_block", "save_block"]
