"""One settings model for broker connections: URLs, credentials, TLS.

Every exactly-once path (``pulsar-txn process``, ``replay``, ``spark submit``, the Spark source,
sink and runtime, the control plane) takes a :class:`BrokerSettings`, built from command-line
flags (:func:`add_broker_arguments` / :meth:`BrokerSettings.from_args`), from the environment
(:meth:`BrokerSettings.from_env`, prefix ``PULSAR_TXN_``), or directly.

=================================  ======================================  ===========================
field                              environment variable                    flag
=================================  ======================================  ===========================
``service_url``                    ``PULSAR_TXN_SERVICE_URL``              ``--service-url``
``admin_url``                      ``PULSAR_TXN_ADMIN_URL``                ``--admin-url``
``auth_token``                     ``PULSAR_TXN_AUTH_TOKEN``               ``--auth-token``
``auth_token_file``                ``PULSAR_TXN_AUTH_TOKEN_FILE``          ``--auth-token-file``
``tls_trust_certs_file_path``      ``PULSAR_TXN_TLS_TRUST_CERTS``          ``--tls-trust-certs``
``tls_validate_hostname``          ``PULSAR_TXN_TLS_VALIDATE_HOSTNAME``    ``--tls-validate-hostname``
``tls_allow_insecure_connection``  ``PULSAR_TXN_TLS_ALLOW_INSECURE``       ``--tls-allow-insecure``
``tls_certificate_file_path``      ``PULSAR_TXN_TLS_CERT_FILE``            ``--tls-cert-file``
``tls_private_key_file_path``      ``PULSAR_TXN_TLS_KEY_FILE``             ``--tls-key-file``
``auth_oauth2_issuer_url``         ``PULSAR_TXN_AUTH_OAUTH2_ISSUER_URL``   ``--auth-oauth2-issuer-url``
``auth_oauth2_client_id``          ``PULSAR_TXN_AUTH_OAUTH2_CLIENT_ID``    ``--auth-oauth2-client-id``
``auth_oauth2_client_secret``      ``PULSAR_TXN_AUTH_OAUTH2_CLIENT_SECRET`` ``--auth-oauth2-client-secret``
``auth_oauth2_private_key``        ``PULSAR_TXN_AUTH_OAUTH2_PRIVATE_KEY``  ``--auth-oauth2-private-key``
``auth_oauth2_audience``           ``PULSAR_TXN_AUTH_OAUTH2_AUDIENCE``     ``--auth-oauth2-audience``
``auth_oauth2_scope``              ``PULSAR_TXN_AUTH_OAUTH2_SCOPE``        ``--auth-oauth2-scope``
``auth_basic_username``            ``PULSAR_TXN_AUTH_BASIC_USERNAME``      ``--auth-basic-username``
``auth_basic_password``            ``PULSAR_TXN_AUTH_BASIC_PASSWORD``      ``--auth-basic-password``
=================================  ======================================  ===========================

A flag wins over the environment. One way to authenticate at most:

- **token** (``auth_token`` or ``auth_token_file``): sent to the broker and, as a bearer token, to
  the admin REST API;
- **OAuth2 client credentials** (``auth_oauth2_*``, the official ``AuthenticationOauth2``
  parameters): ``issuer_url`` and either ``client_id`` + ``client_secret`` or ``private_key`` (a
  JSON credentials file holding them); the access token goes where a token would, and is fetched
  again before it expires;
- **basic** (``auth_basic_username`` + ``auth_basic_password``): to the broker, and as
  ``Authorization: Basic`` to the admin REST API;
- **TLS client certificate** (``tls_certificate_file_path`` + ``tls_private_key_file_path``): with
  no other method it authenticates (``AuthenticationTLS``, needs ``pulsar+ssl://``); with one, it
  is still presented in every TLS handshake (mutual TLS), broker and ``https://`` admin alike.

The trust certificates verify both ``pulsar+ssl://`` and ``https://`` (and an ``https://`` OAuth2
issuer).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .auth import (
    Authentication,
    AuthenticationBasic,
    AuthenticationOauth2,
    AuthenticationTLS,
    AuthenticationToken,
)

__all__ = ["ENV_PREFIX", "BrokerSettings", "SettingsError", "add_broker_arguments"]

ENV_PREFIX = "PULSAR_TXN_"

_ENV = {
    "service_url": "SERVICE_URL",
    "admin_url": "ADMIN_URL",
    "auth_token": "AUTH_TOKEN",
    "auth_token_file": "AUTH_TOKEN_FILE",
    "tls_trust_certs_file_path": "TLS_TRUST_CERTS",
    "tls_validate_hostname": "TLS_VALIDATE_HOSTNAME",
    "tls_allow_insecure_connection": "TLS_ALLOW_INSECURE",
    "tls_certificate_file_path": "TLS_CERT_FILE",
    "tls_private_key_file_path": "TLS_KEY_FILE",
    "auth_oauth2_issuer_url": "AUTH_OAUTH2_ISSUER_URL",
    "auth_oauth2_client_id": "AUTH_OAUTH2_CLIENT_ID",
    "auth_oauth2_client_secret": "AUTH_OAUTH2_CLIENT_SECRET",
    "auth_oauth2_private_key": "AUTH_OAUTH2_PRIVATE_KEY",
    "auth_oauth2_audience": "AUTH_OAUTH2_AUDIENCE",
    "auth_oauth2_scope": "AUTH_OAUTH2_SCOPE",
    "auth_basic_username": "AUTH_BASIC_USERNAME",
    "auth_basic_password": "AUTH_BASIC_PASSWORD",
}
#: Settings that hold secrets: hidden by :meth:`BrokerSettings.redacted`.
_SECRETS = ("auth_token", "auth_oauth2_client_secret", "auth_basic_password")
_OAUTH2 = ("auth_oauth2_issuer_url", "auth_oauth2_client_id", "auth_oauth2_client_secret", "auth_oauth2_private_key",
           "auth_oauth2_audience", "auth_oauth2_scope")
_BOOLS = {"tls_validate_hostname", "tls_allow_insecure_connection"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A broker setting is malformed or contradicts another one."""


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to authenticate to it (see the module's table).

    ``auth_token`` and ``auth_token_file`` are exclusive; the file is read at each connect, so
    a rotated token is picked up on reconnect. Token, OAuth2 and basic are exclusive; a client
    certificate goes with any of them.
    """

    service_url: str | None = None
    admin_url: str | None = None
    auth_token: str | None = None
    auth_token_file: str | None = None
    tls_trust_certs_file_path: str | None = None
    tls_validate_hostname: bool = False
    tls_allow_insecure_connection: bool = False
    tls_certificate_file_path: str | None = None
    tls_private_key_file_path: str | None = None
    auth_oauth2_issuer_url: str | None = None
    auth_oauth2_client_id: str | None = None
    auth_oauth2_client_secret: str | None = None
    auth_oauth2_private_key: str | None = None
    auth_oauth2_audience: str | None = None
    auth_oauth2_scope: str | None = None
    auth_basic_username: str | None = None
    auth_basic_password: str | None = None

    def __post_init__(self) -> None:
        if self.service_url is not None and not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise SettingsError(f"service URL must start with pulsar:// or pulsar+ssl://, got {self.service_url!r}")
        if self.admin_url is not None and not self.admin_url.startswith(("http://", "https://")):
            raise SettingsError(f"admin URL must start with http:// or https://, got {self.admin_url!r}")
        if self.auth_token and self.auth_token_file:
            raise SettingsError("give an auth token or an auth token file, not both")
        if self.tls_trust_certs_file_path and not Path(self.tls_trust_certs_file_path).is_file():
            raise SettingsError(f"TLS trust certificates file not found: {self.tls_trust_certs_file_path}")
        methods = [name for name, on in (
            ("token", self.auth_token or self.auth_token_file),
            ("OAuth2", any(getattr(self, f) for f in _OAUTH2)),
            ("basic", self.auth_basic_username or self.auth_basic_password)) if on]
        if len(methods) > 1:
            raise SettingsError(f"give one way to authenticate, not {' and '.join(methods)}")
        if bool(self.tls_certificate_file_path) != bool(self.tls_private_key_file_path):
            raise SettingsError(f"a TLS client certificate needs both {ENV_PREFIX}TLS_CERT_FILE (--tls-cert-file) "
                                f"and {ENV_PREFIX}TLS_KEY_FILE (--tls-key-file)")
        for path, what in ((self.tls_certificate_file_path, "TLS client certificate"),
                           (self.tls_private_key_file_path, "TLS client key")):
            if path and not Path(path).is_file():
                raise SettingsError(f"{what} file not found: {path}")
        if (self.tls_certificate_file_path and not methods and self.service_url
                and not self.service_url.startswith("pulsar+ssl://")):
            raise SettingsError("a TLS client certificate authenticates only over TLS: the service URL must be "
                                f"pulsar+ssl://, got {self.service_url!r}")
        if methods == ["basic"] and not (self.auth_basic_username and self.auth_basic_password is not None):
            raise SettingsError(f"basic authentication needs both {ENV_PREFIX}AUTH_BASIC_USERNAME "
                                f"(--auth-basic-username) and {ENV_PREFIX}AUTH_BASIC_PASSWORD (--auth-basic-password)")
        if methods == ["OAuth2"]:
            try:
                AuthenticationOauth2(self._oauth2_params())  # checks the parameters and the credentials file
            except ValueError as exc:
                raise SettingsError(f"OAuth2 settings ({ENV_PREFIX}AUTH_OAUTH2_*): {exc}") from None

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> BrokerSettings:
        """Settings from ``PULSAR_TXN_*`` variables; keyword overrides that are not None win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, suffix in _ENV.items():
            raw = env.get(ENV_PREFIX + suffix)
            if raw is None:
                continue
            values[name] = _parse_bool(ENV_PREFIX + suffix, raw) if name in _BOOLS else (raw or None)
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown broker setting(s): {', '.join(sorted(unknown))}")
        return cls(**values)

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> BrokerSettings:
        """Settings from :func:`add_broker_arguments` flags over the environment."""
        overrides = {name: getattr(args, name, None) for name in _ENV}
        for name in _BOOLS:  # store_true flags default to None so the environment can speak
            if overrides[name] is False:
                overrides[name] = None
        return cls.from_env(environ, **overrides)

    def with_urls(self, service_url: str | None = None, admin_url: str | None = None) -> BrokerSettings:
        """A copy with the URLs replaced where given."""
        return replace(self, service_url=service_url or self.service_url, admin_url=admin_url or self.admin_url)

    # -- use ------------------------------------------------------------------------------------

    def token(self) -> str | None:
        """The token (read from ``auth_token_file`` if that is set), or None."""
        if self.auth_token_file:
            return Path(self.auth_token_file).read_text().strip() or None
        return self.auth_token or None

    def require_service_url(self) -> str:
        """The service URL, or a :class:`SettingsError` naming the flag and the variable."""
        if not self.service_url:
            raise SettingsError(f"no broker service URL: pass --service-url or set {ENV_PREFIX}SERVICE_URL")
        return self.service_url

    def require_admin_url(self) -> str:
        """The admin URL, or a :class:`SettingsError` naming the flag and the variable."""
        if not self.admin_url:
            raise SettingsError(f"no broker admin URL: pass --admin-url or set {ENV_PREFIX}ADMIN_URL")
        return self.admin_url

    def _oauth2_params(self) -> str:
        """The official ``AuthenticationOauth2`` parameter string of the ``auth_oauth2_*`` settings."""
        params = {"type": "client_credentials"}
        for name in _OAUTH2:
            value = getattr(self, name)
            if value:
                params[name[len("auth_oauth2_"):]] = value
        return json.dumps(params, sort_keys=True)

    def authentication(self) -> Authentication | None:
        """The provider these settings name, or None.

        OAuth2 providers are shared per process by their parameters, so every client, admin call
        and Spark task of a process uses one cached access token.
        """
        if self.auth_token_file:
            return AuthenticationToken("file://" + str(Path(self.auth_token_file).resolve()))
        if self.auth_token:
            return AuthenticationToken(self.auth_token)
        if any(getattr(self, name) for name in _OAUTH2):
            return _shared_oauth2(self._oauth2_params())
        if self.auth_basic_username:
            return AuthenticationBasic(self.auth_basic_username, self.auth_basic_password or "")
        if self.tls_certificate_file_path and self.tls_private_key_file_path:
            return AuthenticationTLS(self.tls_certificate_file_path, self.tls_private_key_file_path)
        return None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`txn.AsyncClient` / :class:`txn.Client` (not the URL)."""
        kw: dict[str, Any] = {}
        auth = self.authentication()
        if auth is not None:
            kw["authentication"] = auth
        if self.tls_certificate_file_path and not isinstance(auth, AuthenticationTLS):
            kw["tls_certificate_file_path"] = self.tls_certificate_file_path
            kw["tls_private_key_file_path"] = self.tls_private_key_file_path
        if self.tls_trust_certs_file_path:
            kw["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        if self.tls_validate_hostname:
            kw["tls_validate_hostname"] = True
        if self.tls_allow_insecure_connection:
            kw["tls_allow_insecure_connection"] = True
        return kw

    def admin_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`txn.admin.admin_request`: ``token`` and an SSL ``context``.

        ``token`` is the token string, or for OAuth2 and basic the provider itself (its headers
        are asked for at each request, so a refreshed OAuth2 token is used). The context holds
        the client certificate, if any.
        """
        kw: dict[str, Any] = {}
        tok = self.token()
        if tok:
            kw["token"] = tok
        elif not (self.auth_token or self.auth_token_file):
            auth = self.authentication()
            if isinstance(auth, (AuthenticationOauth2, AuthenticationBasic)):
                kw["token"] = auth
        if self.admin_url and self.admin_url.startswith("https://"):
            kw["context"] = self.ssl_context()
        return kw

    def ssl_context(self) -> ssl.SSLContext:
        """An SSL context that trusts ``tls_trust_certs_file_path`` (or the system store) and
        presents the client certificate, if any."""
        from .pool import load_client_certificate

        ctx = ssl.create_default_context(cafile=self.tls_trust_certs_file_path)
        if self.tls_allow_insecure_connection:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.tls_validate_hostname
        if self.tls_certificate_file_path and self.tls_private_key_file_path:
            load_client_certificate(ctx, self.tls_certificate_file_path, self.tls_private_key_file_path)
        return ctx

    def redacted(self) -> dict[str, Any]:
        """The settings with the secrets (token, client secret, password) hidden, for logs and
        ``--help`` output."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _SECRETS:
            if out[name]:
                out[name] = "***"
        return out


_oauth2_lock = threading.Lock()
_oauth2_shared: dict[str, AuthenticationOauth2] = {}


def _shared_oauth2(params: str) -> AuthenticationOauth2:
    """One :class:`AuthenticationOauth2` per parameter string in this process."""
    with _oauth2_lock:
        auth = _oauth2_shared.get(params)
        if auth is None:
            auth = _oauth2_shared[params] = AuthenticationOauth2(params)
        return auth


def add_broker_arguments(parser: argparse.ArgumentParser, *, service_url_required: bool = False,
                         admin_url: bool = True) -> None:
    """Add the broker connection flags (see the module's table) to ``parser``.

    A required service URL may still come from ``PULSAR_TXN_SERVICE_URL``; the command checks
    with :meth:`BrokerSettings.require_service_url`.
    """
    g = parser.add_argument_group("broker connection (flags win over PULSAR_TXN_* variables)")
    need = " (required)" if service_url_required else ""
    g.add_argument("--service-url", default=None, help=f"pulsar:// or pulsar+ssl:// URL{need}; "
                   f"env {ENV_PREFIX}SERVICE_URL")
    if admin_url:
        g.add_argument("--admin-url", default=None, help=f"http(s):// admin REST URL; env {ENV_PREFIX}ADMIN_URL")
    g.add_argument("--auth-token", default=None, help=f"token for the broker and admin API; env {ENV_PREFIX}AUTH_TOKEN")
    g.add_argument("--auth-token-file", default=None,
                   help=f"file holding the token, re-read at each connect; env {ENV_PREFIX}AUTH_TOKEN_FILE")
    g.add_argument("--tls-trust-certs", dest="tls_trust_certs_file_path", default=None,
                   help=f"CA certificates (PEM) for pulsar+ssl:// and https://; env {ENV_PREFIX}TLS_TRUST_CERTS")
    g.add_argument("--tls-validate-hostname", action="store_true", default=None,
                   help=f"check the broker's certificate names its host; env {ENV_PREFIX}TLS_VALIDATE_HOSTNAME")
    g.add_argument("--tls-allow-insecure", dest="tls_allow_insecure_connection", action="store_true", default=None,
                   help=f"accept any broker certificate (testing only); env {ENV_PREFIX}TLS_ALLOW_INSECURE")
    g.add_argument("--tls-cert-file", dest="tls_certificate_file_path", default=None,
                   help="client certificate (PEM) for TLS handshakes; alone, it authenticates (TLS auth); "
                        f"env {ENV_PREFIX}TLS_CERT_FILE")
    g.add_argument("--tls-key-file", dest="tls_private_key_file_path", default=None,
                   help=f"private key (PEM) of --tls-cert-file; env {ENV_PREFIX}TLS_KEY_FILE")
    g.add_argument("--auth-oauth2-issuer-url", default=None,
                   help=f"OAuth2 issuer (its /.well-known/openid-configuration names the token endpoint); "
                        f"env {ENV_PREFIX}AUTH_OAUTH2_ISSUER_URL")
    g.add_argument("--auth-oauth2-client-id", default=None,
                   help=f"OAuth2 client id; env {ENV_PREFIX}AUTH_OAUTH2_CLIENT_ID")
    g.add_argument("--auth-oauth2-client-secret", default=None,
                   help=f"OAuth2 client secret; env {ENV_PREFIX}AUTH_OAUTH2_CLIENT_SECRET")
    g.add_argument("--auth-oauth2-private-key", default=None,
                   help="OAuth2 credentials file (JSON with client_id and client_secret): a path, file:///path "
                        f"or data:application/json;base64,...; env {ENV_PREFIX}AUTH_OAUTH2_PRIVATE_KEY")
    g.add_argument("--auth-oauth2-audience", default=None,
                   help=f"OAuth2 audience; env {ENV_PREFIX}AUTH_OAUTH2_AUDIENCE")
    g.add_argument("--auth-oauth2-scope", default=None, help=f"OAuth2 scope; env {ENV_PREFIX}AUTH_OAUTH2_SCOPE")
    g.add_argument("--auth-basic-username", default=None,
                   help=f"basic authentication user; env {ENV_PREFIX}AUTH_BASIC_USERNAME")
    g.add_argument("--auth-basic-password", default=None,
                   help=f"basic authentication password; env {ENV_PREFIX}AUTH_BASIC_PASSWORD")



def _parse_bool(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")
