"""Exceptions raised by components/: each subclasses the built-in a caller would catch."""

from __future__ import annotations

__all__ = [
    "ComponentLoadError",
    "ComponentNotFoundError",
    "CorruptWeightsError",
    "MissingComponentFileError",
    "PickleWeightsError",
    "PipelineTypeError",
    "QuantizationBackendError",
    "QuantizationConfigError",
    "RemoteCodeError",
    "RepoNotFoundError",
    "RevisionNotFoundError",
    "SubfolderNotFoundError",
    "SubfolderOutsideRepoError",
    "VariantNotFoundError",
]


class ComponentLoadError(ValueError):
    """A component could not be loaded from its repo; nothing was registered."""


class RepoNotFoundError(ComponentLoadError, FileNotFoundError):
    """The repo is neither a local folder nor reachable (or cached) on the hub."""


class SubfolderNotFoundError(ComponentLoadError, FileNotFoundError):
    """The repo exists but has no such subfolder."""


class SubfolderOutsideRepoError(ComponentLoadError):
    """The subfolder is absolute or climbs out of its repo with '..'."""


class MissingComponentFileError(ComponentLoadError, FileNotFoundError):
    """The component folder exists but lacks the config file or the weight files its class loads from."""


class VariantNotFoundError(ComponentLoadError, FileNotFoundError):
    """The component folder has weights, but none for the requested variant."""


class RevisionNotFoundError(ComponentLoadError):
    """The repo exists but the requested revision (branch, tag or commit) does not."""


class CorruptWeightsError(ComponentLoadError):
    """A safetensors file is truncated or its header is unreadable."""


class PickleWeightsError(ComponentLoadError):
    """Pickle weights (.bin/.pt/.ckpt) could be read and the caller did not opt in with use_pickle=True.

    Raised when a component folder has only pickle weights for the variant, or holds pickle files in a
    nested folder.
    """


class PipelineTypeError(ComponentLoadError, TypeError):
    """A component's type is a whole pipeline: its loader would read other folders' files, unchecked."""


class QuantizationConfigError(ComponentLoadError, TypeError):
    """A quantization config that the component's class cannot load with (wrong library, not a config, GGUF)."""


class QuantizationBackendError(ComponentLoadError, ImportError):
    """The package of a quantization config's backend is not installed."""


class RemoteCodeError(ComponentLoadError):
    """A class outside diffusers/transformers was requested without trust_remote_code=True."""


class ComponentNotFoundError(KeyError, ValueError):
    """No registered component matches an id, name or pattern (a ValueError too, as the peer raises)."""

    def __str__(self) -> str:
        # KeyError quotes its message; ours is a sentence meant to be read as is.
        return str(self.args[0]) if self.args else ""
