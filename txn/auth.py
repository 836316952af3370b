"""Authentication providers (token), named like the official client's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


class Authentication:
    """Base: a method name and the bytes to send in CONNECT / AUTH_RESPONSE."""

    method_name: str = "none"

    def auth_data(self) -> bytes:
        """Credentials to present to the broker (called on every (re)connect and challenge)."""
        return b""


class AuthenticationToken(Authentication):
    """Token (JWT) authentication.

    ``token`` is the token string, a callable returning it (called at each
    connect, so it may refresh), or ``file:///path`` to read it from a file.
    """

    method_name = "token"

    def __init__(self, token: str | Callable[[], str]) -> None:
        if not token:
            raise ValueError("AuthenticationToken needs a non-empty token")
        self._token = token

    def auth_data(self) -> bytes:
        tok = self._token() if callable(self._token) else self._token
        if tok.startswith("file://"):
            tok = Path(tok[len("file://") :]).read_text().strip()
        return tok.encode()
