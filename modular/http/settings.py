"""How a server listens and what a request may send: address, token, and the limits on bodies and uploads."""

from __future__ import annotations

import ipaddress
import os

import attrs

__all__ = ["TOKEN_VARIABLE", "ServerSettings"]

TOKEN_VARIABLE = "MODULAR_SERVE_TOKEN"
LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.frozen
class ServerSettings:
    """Where a server listens and what it takes.

    Attributes:
        host, port: The address (``127.0.0.1`` by default; port 0 picks a free one).
        token: The bearer token every request but ``/healthz`` must carry (``Authorization: Bearer <token>``,
            or ``?token=`` for the page's event streams); ``None`` reads ``MODULAR_SERVE_TOKEN``. Required to
            bind any address but loopback.
        max_body: Bytes of one request body at most (uploads included).
        max_upload: Bytes of one input image at most.
    """

    host: str = "127.0.0.1"
    port: int = 8188
    token: str | None = None
    max_body: int = 32 * 1024 * 1024
    max_upload: int = 16 * 1024 * 1024

    def resolved_token(self) -> str | None:
        return self.token if self.token is not None else (os.environ.get(TOKEN_VARIABLE) or None)

    def check(self) -> None:
        """Raises ValueError for settings a server must not start with (another address without a token)."""
        if not is_loopback(self.host) and not self.resolved_token():
            msg = (
                f"binding {self.host!r} lets other machines reach this server: give a token with --token or "
                f"{TOKEN_VARIABLE}, or bind 127.0.0.1"
            )
            raise ValueError(msg)
        token = self.resolved_token()
        if token is not None and len(token) < 16:
            raise ValueError(
                "a token must be at least 16 characters (e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
            )
