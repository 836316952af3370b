"""Authentication providers, named and parameterised like the official client's.

- :class:`AuthenticationToken`: a JWT (method ``token``).
- :class:`AuthenticationOauth2`: the OAuth 2.0 client-credentials grant; the access token is
  sent as method ``token`` and fetched again before it expires.
- :class:`AuthenticationTLS`: a client certificate presented in the TLS handshake (method ``tls``).
- :class:`AuthenticationBasic`: a user name and password (method ``basic``).

A provider gives the bytes for CONNECT and for the broker's AUTH_CHALLENGE
(:meth:`Authentication.auth_data_async`), the HTTP headers for the admin REST API
(:meth:`Authentication.http_headers`), and, for TLS, the client certificate files.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import AuthenticationError

__all__ = [
    "Authentication",
    "AuthenticationBasic",
    "AuthenticationOauth2",
    "AuthenticationTLS",
    "AuthenticationToken",
]


class Authentication:
    """Base: a method name and the bytes to send in CONNECT / AUTH_RESPONSE."""

    method_name: str = "none"

    def auth_data(self) -> bytes:
        """Credentials to present to the broker (called on every (re)connect and challenge)."""
        return b""

    async def auth_data_async(self, stale: bytes | None = None) -> bytes:
        """:meth:`auth_data` without blocking the event loop.

        ``stale`` is what this connection last sent, when the broker has challenged it (the
        token provider challenges once that token has expired): a provider that can fetch
        credentials returns newer ones then.
        """
        return self.auth_data()

    def http_headers(self) -> dict[str, str]:
        """Headers that authenticate an admin REST request (none by default)."""
        return {}

    def tls_client_files(self) -> tuple[str, str] | None:
        """``(certificate, private key)`` PEM files to present in TLS handshakes, or None."""
        return None

    def configure_client_tls(self, trust_certs_file_path: str | None, allow_insecure: bool = False) -> None:
        """Called by the client with its TLS trust settings (OAuth2 uses them for an https issuer)."""


def _check_str(value: Any, name: str) -> str:
    # The official client raises ValueError for an argument of the wrong type.
    if not isinstance(value, str):
        raise ValueError(f"Argument {name} is expected to be of type 'str' and not '{type(value).__name__}'")
    return value


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

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.auth_data().decode()}"}


class AuthenticationTLS(Authentication):
    """TLS client-certificate authentication: the broker's TLS provider takes the role from the
    certificate (its CN). Needs a ``pulsar+ssl://`` service URL; the files are read when the
    client is created."""

    method_name = "tls"

    def __init__(self, certificate_path: str, private_key_path: str) -> None:
        self.certificate_path = _check_str(certificate_path, "certificate_path")
        self.private_key_path = _check_str(private_key_path, "private_key_path")

    def tls_client_files(self) -> tuple[str, str]:
        return self.certificate_path, self.private_key_path


class AuthenticationBasic(Authentication):
    """Basic authentication: ``username:password`` to the broker, ``Authorization: Basic`` to
    the admin API.

    As the official client: ``AuthenticationBasic(username, password, method="basic")`` or
    ``AuthenticationBasic(auth_params_string='{"username": ..., "password": ..., "method": ...}')``
    (the string wins when given).
    """

    def __init__(self, username: str | None = None, password: str | None = None, method: str = "basic",
                 auth_params_string: str | None = None) -> None:
        if auth_params_string is not None:
            params = _json_params(_check_str(auth_params_string, "auth_params_string"), "AuthenticationBasic")
            for key in ("username", "password"):
                if key not in params:
                    raise ValueError(f"No {key} provided for basic provider")
            username, password = params["username"], params["password"]
            method = params.get("method", "basic")
        self.username = _check_str(username, "username")
        self._password = _check_str(password, "password")
        self.method_name = _check_str(method, "method")

    def auth_data(self) -> bytes:
        return f"{self.username}:{self._password}".encode()

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(self.auth_data()).decode("ascii")}


def _json_params(text: str, who: str) -> dict[str, str]:
    """A JSON object of auth parameters, its values as strings (as the official client reads them)."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{who}: the auth parameters are not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{who}: the auth parameters must be a JSON object, got {type(obj).__name__}")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in obj.items()}


# ---------------------------------------------------------------------------------------- OAuth2


@dataclass(frozen=True)
class _CachedToken:
    token: str
    #: Wall-clock expiry (the sooner of ``expires_in`` and the JWT's ``exp``), or None if unknown.
    expires_at: float | None
    #: Fetch again this long before ``expires_at``.
    margin: float


def _jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (not verified: only to know when to fetch a new one), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, TypeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


def _read_credentials(private_key: str) -> tuple[str, str]:
    """``client_id`` and ``client_secret`` from the official ``private_key`` forms: a path,
    ``file:///path``, ``file:/path`` or ``data:application/json;base64,<data>``."""
    where = "private_key"
    try:
        if private_key.startswith("data:"):
            head, sep, data = private_key[len("data:"):].partition(",")
            if not sep or head != "application/json;base64":
                raise ValueError("a data: URL must be data:application/json;base64,<data>")
            text = base64.b64decode(data, validate=True).decode()
            where = "private_key data: URL"
        else:
            path = private_key
            if path.startswith("file://"):
                path = path[len("file://"):]
            elif path.startswith("file:"):
                path = path[len("file:"):]
            where = f"credentials file {path}"
            text = Path(path).read_text()
        obj = json.loads(text)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"AuthenticationOauth2: cannot read the {where}: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("client_id"), str) \
            or not isinstance(obj.get("client_secret"), str):
        raise ValueError(f"AuthenticationOauth2: the {where} needs the string fields client_id and client_secret")
    return obj["client_id"], obj["client_secret"]


class AuthenticationOauth2(Authentication):
    """OAuth 2.0 client credentials, as the official ``AuthenticationOauth2(auth_params_string)``.

    ``auth_params_string`` is a JSON object with ``issuer_url`` and either ``private_key`` (a
    JSON credentials file with ``client_id`` and ``client_secret``: a path, ``file:///path``,
    ``file:/path`` or ``data:application/json;base64,...``) or ``client_id`` and
    ``client_secret``; ``audience`` and ``scope`` are optional (``type`` is ignored).

    The token endpoint comes from ``<issuer_url>/.well-known/openid-configuration``. The access
    token is sent as method ``token`` and cached until shortly before it expires (the sooner of
    the response's ``expires_in`` and the token's own ``exp`` claim), or until the broker
    challenges the token a connection sent. Failures raise :class:`~txn.errors.AuthenticationError`;
    an unreachable issuer or a 5xx answer is ``retriable`` (the client retries it like an
    unreachable broker), a refusal (4xx) or a malformed answer is not.
    Malformed parameters raise ``ValueError`` at once.
    """

    method_name = "token"
    #: Seconds to wait for each HTTP request to the issuer.
    http_timeout: float = 10.0

    def __init__(self, auth_params_string: str) -> None:
        params = _json_params(_check_str(auth_params_string, "auth_params_string"), "AuthenticationOauth2")
        method = params.get("tokenEndpointAuthMethod", "client_secret_post")
        if method != "client_secret_post":
            raise ValueError(f"AuthenticationOauth2: tokenEndpointAuthMethod {method!r} is not supported "
                             "(only client_secret_post, the client-credentials grant)")
        self.issuer_url = params.get("issuer_url", "").strip()
        if not self.issuer_url:
            raise ValueError("AuthenticationOauth2: issuer_url is required")
        if not self.issuer_url.startswith(("http://", "https://")):
            raise ValueError(f"AuthenticationOauth2: issuer_url must be an http(s) URL, got {self.issuer_url!r}")
        if params.get("private_key"):
            self.client_id, self._client_secret = _read_credentials(params["private_key"])
        else:
            if not params.get("client_id") or "client_secret" not in params:
                raise ValueError("AuthenticationOauth2: give private_key (a credentials file) or client_id "
                                 "and client_secret")
            self.client_id, self._client_secret = params["client_id"], params["client_secret"]
        self.audience = params.get("audience") or None
        self.scope = params.get("scope") or None
        self._trust: str | None = None
        self._insecure = False
        self._token_endpoint: str | None = None
        self._cached: _CachedToken | None = None
        self._lock = threading.Lock()
        #: Tokens fetched so far (diagnostics and tests).
        self.fetches = 0

    def __repr__(self) -> str:
        return f"AuthenticationOauth2(issuer_url={self.issuer_url!r}, client_id={self.client_id!r})"

    def configure_client_tls(self, trust_certs_file_path: str | None, allow_insecure: bool = False) -> None:
        if trust_certs_file_path and self._trust is None:
            self._trust = trust_certs_file_path
        self._insecure = self._insecure or allow_insecure

    # -- the token ------------------------------------------------------------------------------

    def _usable(self, stale: bytes | None) -> str | None:
        c = self._cached
        if c is None or (stale is not None and c.token.encode() == stale):
            return None
        if c.expires_at is not None and time.time() >= c.expires_at - c.margin:
            return None
        return c.token

    def access_token(self, stale: bytes | None = None) -> str:
        """The cached access token, or a new one if it is near expiry or is ``stale`` (blocking)."""
        tok = self._usable(stale)
        if tok is not None:
            return tok
        with self._lock:  # one fetch at a time; a waiter takes what the fetch before it got
            tok = self._usable(stale)
            if tok is None:
                self._cached = self._fetch()
                self.fetches += 1
                tok = self._cached.token
        return tok

    def auth_data(self) -> bytes:
        return self.access_token().encode()

    async def auth_data_async(self, stale: bytes | None = None) -> bytes:
        tok = self._usable(stale)
        if tok is None:
            tok = await asyncio.to_thread(self.access_token, stale)
        return tok.encode()

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token()}"}

    # -- HTTP -----------------------------------------------------------------------------------

    def _context(self, url: str) -> ssl.SSLContext | None:
        if not url.startswith("https://"):
            return None
        ctx = ssl.create_default_context(cafile=self._trust)
        if self._insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _request(self, what: str, url: str, data: bytes | None = None) -> dict[str, Any]:
        """GET (or POST ``data``, form-encoded) ``url`` and parse its JSON object answer."""
        req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=self.http_timeout, context=self._context(url)) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()[:500].decode("utf-8", "replace")
            detail = body
            try:
                obj = json.loads(body)
                if isinstance(obj, dict) and obj.get("error"):
                    detail = " ".join(str(obj[k]) for k in ("error", "error_description") if obj.get(k))
            except ValueError:
                pass
            refused = exc.code in (400, 401, 403)
            msg = (f"OAuth2 {what} {url} refused the client credentials of client_id {self.client_id!r}"
                   if refused else f"OAuth2 {what} {url} failed")
            err = AuthenticationError(f"{msg}: HTTP {exc.code} {detail}".rstrip())
            err.retriable = exc.code >= 500 or exc.code == 429
            raise err from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, timeouts, refusals, bad URLs
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            err = AuthenticationError(f"OAuth2 {what} {url} is unreachable: {reason}")
            err.retriable = True
            raise err from None
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise AuthenticationError(f"OAuth2 {what} {url} sent a malformed response (not a JSON object): "
                                      f"{raw[:200]!r}")
        return obj

    def _endpoint(self) -> str:
        if self._token_endpoint is None:
            url = self.issuer_url.rstrip("/") + "/.well-known/openid-configuration"
            doc = self._request("discovery document", url)
            endpoint = doc.get("token_endpoint")
            if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
                raise AuthenticationError(f"OAuth2 discovery document {url} sent a malformed response: "
                                          f"no http(s) token_endpoint in it")
            self._token_endpoint = endpoint
        return self._token_endpoint

    def _fetch(self) -> _CachedToken:
        endpoint = self._endpoint()
        form = {"grant_type": "client_credentials", "client_id": self.client_id, "client_secret": self._client_secret}
        if self.audience:
            form["audience"] = self.audience
        if self.scope:
            form["scope"] = self.scope
        t0 = time.time()
        answer = self._request("token endpoint", endpoint, urllib.parse.urlencode(form).encode())
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise AuthenticationError(f"OAuth2 token endpoint {endpoint} sent a malformed response: no access_token "
                                      f"(fields: {', '.join(sorted(answer)) or 'none'})")
        expiries = []
        expires_in = answer.get("expires_in")
        if isinstance(expires_in, str) and expires_in.strip().isdigit():
            expires_in = int(expires_in)
        if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool) and expires_in > 0:
            expiries.append(t0 + float(expires_in))
        jwt_exp = _jwt_expiry(token)
        if jwt_exp is not None:
            expiries.append(jwt_exp)
        expires_at = min(expiries) if expiries else None
        lifetime = (expires_at - t0) if expires_at is not None else 0.0
        # Fetch a new token when a fifth of its lifetime is left (at most a minute before expiry).
        return _CachedToken(token, expires_at, min(60.0, max(0.5, lifetime / 5)))
