"""Blocks shared as repos: a block's code and ``modular_config.json``, in the peer's layout.

``ModularPipelineBlocks.from_pretrained(repo, trust_remote_code=True)`` loads one (``load.py``) from a local
folder or a pinned hub revision (``source.py``), running its code with the peer's
``diffusers.modular_pipelines`` names mapped to ours (``peer_imports.py``, ``code.py``);
``block.save_pretrained(folder)`` writes one (``save.py``), with the requirements of the blocks inside it
(``requirements.py``, checked again by a load).
"""

from modular.remote.load import load_block
from modular.remote.peer_imports import PEER_NAMES, PeerImportError
from modular.remote.save import save_block
from modular.remote.source import CONFIG_NAME, BlockSource

__all__ = ["CONFIG_NAME", "PEER_NAMES", "BlockSource", "PeerImportError", "load_block", "save_block"]
