"""Consent to run a repo's own code (``trust_remote_code``), given per repo.

A consent is ``False`` (none), ``True`` (the repo being loaded: for a pipeline, its own repo only), or one
repo id / folder or a list of them. Components that an index takes from another repo load without remote
code unless that repo is named: consent given for one repo never reaches code from another (the peer's rule,
``ModularPipeline.load_components`` in diffusers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .load_id import canonical_repo

__all__ = ["RemoteCodeConsent", "check_consent", "consent_covers", "consent_for_pipeline", "refusal_hint"]

#: What ``trust_remote_code=`` accepts.
RemoteCodeConsent = bool | str | os.PathLike | Sequence[str | os.PathLike]


def _norm(repo: str | os.PathLike) -> str:
    """A repo as consent compares it: a hub id as written, a local folder by its resolved path."""
    return canonical_repo(os.fspath(repo))  # as load IDs name it: one folder however spelled


def check_consent(consent: object, caller: str) -> None:
    """Refuses a ``trust_remote_code`` value of the wrong kind before anything loads.

    Raises:
        TypeError: not a bool, a repo (str or path) or a list/tuple of repos.
    """
    if isinstance(consent, bool | str | os.PathLike):
        return
    if isinstance(consent, list | tuple) and all(isinstance(r, str | os.PathLike) for r in consent):
        return
    msg = (
        f"{caller}: trust_remote_code must be True/False, a repo id or folder, or a list of them "
        f"(got {consent!r} that is a {type(consent).__name__})."
    )
    raise TypeError(msg)


def consent_covers(consent: RemoteCodeConsent | None, repo: str | os.PathLike | None) -> bool:
    """Whether ``consent`` lets code from ``repo`` run; ``True`` stands for the repo being loaded."""
    if consent is None or consent is False or repo is None:
        return False
    if consent is True:
        return True
    named = [consent] if isinstance(consent, str | os.PathLike) else list(consent)
    return _norm(repo) in {_norm(r) for r in named}


def consent_for_pipeline(
    consent: RemoteCodeConsent | None, own_repo: str | os.PathLike | None, caller: str = "trust_remote_code"
) -> RemoteCodeConsent | None:
    """A pipeline's consent as each component load reads it: ``True`` means the pipeline's own repo only.

    A pipeline without a repo of its own (made from blocks) passes ``True`` on, so each component's own repo
    is meant, as the peer does.

    Raises:
        TypeError: ``consent`` is of the wrong kind (:func:`check_consent`).
    """
    if consent is not None:
        check_consent(consent, caller)
    if consent is True and own_repo is not None:
        return [os.fspath(own_repo)]
    return consent


def refusal_hint(consent: RemoteCodeConsent | None, repo: str | os.PathLike) -> str:
    """What to do when ``repo`` needs remote code that ``consent`` does not cover."""
    if consent is None or isinstance(consent, bool):  # True covers every repo it is asked about
        return "Pass trust_remote_code=True if you trust the repo, or give a type_hint."
    named = [consent] if isinstance(consent, str | os.PathLike) else list(consent)
    shown = [os.fspath(r) for r in named]
    return (
        f"trust_remote_code covers only {shown}, and consent is per repo: code from other repos never runs "
        f"on it. If you trust {os.fspath(repo)!r}, name it too: trust_remote_code={[*shown, os.fspath(repo)]!r}."
    )
