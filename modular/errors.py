"""Errors of the block framework. Each subclasses a built-in so callers can catch the usual kinds."""

from __future__ import annotations

from typing import Any

__all__ = [
    "BlockCompositionError",
    "MissingInputError",
    "InputTypeError",
    "UnknownInputError",
    "UnknownOutputError",
    "UnknownWorkflowError",
    "ComponentNotLoadedError",
    "IndexFileError",
    "SaveTargetInUseError",
    "BlockRepoError",
    "BlockCodeError",
    "CallCancelled",
    "PreviewUnavailableError",
]


class BlockCompositionError(ValueError):
    """Blocks that cannot work together; the message lists every problem found, each naming both blocks."""

    def __init__(self, owner: str, problems: list[str]) -> None:
        self.owner = owner
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{owner}: the blocks do not fit together:\n{lines}")


class MissingInputError(ValueError):
    """A required input was not given and no earlier block produces it."""


class InputTypeError(TypeError):
    """A value given to the pipeline does not fit the type its input declares."""


class UnknownInputError(TypeError):
    """A keyword given to the pipeline is not an input of any of its blocks."""


class UnknownOutputError(KeyError):
    """``output=`` names a value that the pipeline call does not produce."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class UnknownWorkflowError(KeyError, ValueError):
    """A workflow name the blocks do not declare. A ``KeyError`` (a name not found) and, as the peer raises, a
    ``ValueError``."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class ComponentNotLoadedError(ValueError):
    """A block needs a component that has not been loaded yet."""


class IndexFileError(ValueError):
    """An index file (``modular_model_index.json``, ``model_index.json``) that cannot be read as one.

    Raised before anything is imported, loaded or registered; the message names the file and lists every
    problem found, each naming its entry.
    """

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"{path}: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"{path}: the index file has {len(self.problems)} problems:\n{lines}"
        super().__init__(message)


class SaveTargetInUseError(ValueError):
    """A save would replace files that a loaded component reads (or may still read) its weights from."""


class BlockRepoError(ValueError):
    """A block repo (code and ``modular_config.json``) that cannot be loaded or a block that cannot be saved as one.

    The message names the repo (and commit) or folder and the file at fault. Raised before any of the repo's
    code runs, except where the class it defines turns out not to be a block; nothing is registered then.
    """


class BlockCodeError(BlockRepoError, ImportError):
    """A block repo's code does not parse or fails while it is imported; the original error is chained."""


class PreviewUnavailableError(ValueError):
    """A call asked for previews its denoising loop cannot make: no latent-to-RGB map for its family, or a
    map or ``preview_decoder`` of another latent space. Said before anything runs."""


class CallCancelled(RuntimeError):
    """A call stopped because its ``cancel`` was set (``pipe(..., cancel=event)``), before a block or a step.

    Attributes:
        block: the name of the block it stopped at (dotted when nested).
        step: the step (0-based) of that block's denoising loop it stopped before, or ``None`` between blocks.
        total: the loop's number of steps, or ``None``.
        reason: what the canceller said (``CancelToken.cancel(reason)``), or ``None``.
    """

    def __init__(
        self, block: str, step: int | None = None, total: int | None = None, reason: str | None = None
    ):
        self.block = block
        self.step = step
        self.total = total
        self.reason = reason
        where = f"block {block!r}" if step is None else f"step {step + 1} of {total} of block {block!r}"
        said = f": {reason}" if reason else ""
        super().__init__(f"the call was cancelled before {where}{said}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (a call in another process reports it)
        return (type(self), (self.block, self.step, self.total, self.reason))
