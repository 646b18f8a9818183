"""The values a job's options take, checked before anything loads: seeds and offload kinds.

Imports nothing heavy, so that the command line refuses a bad value without importing torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DTYPE_NAMES", "MAX_SEED", "OFFLOADS", "seed_problem"]

#: The largest seed a job takes: seeds are 0..2**63-1, as ``batch.derive_seed`` makes them and every generator
#: takes them (``torch.Generator.manual_seed`` overflows past 2**64-1, after the models loaded).
MAX_SEED = 2**63 - 1
OFFLOADS = ("none", "auto", "sim")  # modular batch --offload
DTYPE_NAMES = ("float32", "float16", "bfloat16")  # the torch dtypes a job's weights may be loaded in


def seed_problem(seed: Any) -> str | None:
    """Why ``seed`` is not a job's seed (a whole number from 0 to :data:`MAX_SEED`), or ``None``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        return f"must be a whole number (got {seed!r} that is a {type(seed).__name__})"
    if not 0 <= seed <= MAX_SEED:
        return f"must be from 0 to 2**63-1 = {MAX_SEED} (got {seed})"
    return None
