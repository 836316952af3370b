"""One settings model for broker connections: URLs, token, TLS.

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
=================================  ======================================  ===========================

A flag wins over the environment. The token goes to the broker (binary protocol) and, as a
bearer token, to the admin REST API; the trust certificates verify both ``pulsar+ssl://`` and
``https://``.
"""

from __future__ import annotations

import argparse
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .auth import AuthenticationToken

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
}
_BOOLS = {"tls_validate_hostname", "tls_allow_insecure_connection"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A broker setting is malformed or contradicts another one."""


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to authenticate to it.

    ``auth_token`` and ``auth_token_file`` are exclusive; the file is read at each connect, so
    a rotated token is picked up on reconnect.
    """

    service_url: str | None = None
    admin_url: str | None = None
    auth_token: str | None = None
    auth_token_file: str | None = None
    tls_trust_certs_file_path: str | None = None
    tls_validate_hostname: bool = False
    tls_allow_insecure_connection: bool = False

    def __post_init__(self) -> None:
        if self.service_url is not None and not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise SettingsError(f"service URL must start with pulsar:// or pulsar+ssl://, got {self.service_url!r}")
        if self.admin_url is not None and not self.admin_url.startswith(("http://", "https://")):
            raise SettingsError(f"admin URL must start with http:// or https://, got {self.admin_url!r}")
        if self.auth_token and self.auth_token_file:
            raise SettingsError("give an auth token or an auth token file, not both")
        if self.tls_trust_certs_file_path and not Path(self.tls_trust_certs_file_path).is_file():
            raise SettingsError(f"TLS trust certificates file not found: {self.tls_trust_certs_file_path}")

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

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`txn.AsyncClient` / :class:`txn.Client` (not the URL)."""
        kw: dict[str, Any] = {}
        if self.auth_token_file:
            kw["authentication"] = AuthenticationToken("file://" + str(Path(self.auth_token_file).resolve()))
        elif self.auth_token:
            kw["authentication"] = AuthenticationToken(self.auth_token)
        if self.tls_trust_certs_file_path:
            kw["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        if self.tls_validate_hostname:
            kw["tls_validate_hostname"] = True
        if self.tls_allow_insecure_connection:
            kw["tls_allow_insecure_connection"] = True
        return kw

    def admin_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`txn.admin.admin_request`: ``token`` and an SSL ``context``."""
        kw: dict[str, Any] = {}
        tok = self.token()
        if tok:
            kw["token"] = tok
        if self.admin_url and self.admin_url.startswith("https://"):
            kw["context"] = self.ssl_context()
        return kw

    def ssl_context(self) -> ssl.SSLContext:
        """An SSL context that trusts ``tls_trust_certs_file_path`` (or the system store)."""
        ctx = ssl.create_default_context(cafile=self.tls_trust_certs_file_path)
        if self.tls_allow_insecure_connection:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.tls_validate_hostname
        return ctx

    def redacted(self) -> dict[str, Any]:
        """The settings with the token hidden, for logs and ``--help`` output."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["auth_token"]:
            out["auth_token"] = "***"
        return out


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



def _parse_bool(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")
