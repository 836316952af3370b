"""Option handling shared by the ``pulsar`` source, the ``pulsar-txn`` sink and the runtime.

Spark hands a data source its options as a case-insensitive string map. Three things are common
to every face of ``spark_jobs``:

- **one style**: options are named in camelCase, as Spark's own sources name theirs
  (``serviceUrl``, ``txnTimeoutMs``); the older snake-case names (``service_url``,
  ``txn_timeout_ms``) stay accepted as aliases (:func:`camel_case`, :func:`camel_aliases`);
- **aliases**: users arrive with option names from other Pulsar connectors (StreamNative's
  ``service.url``, ``admin.url``; ``topic`` for one topic on read). :func:`resolve_aliases`
  folds them into one internal key and raises :class:`OptionConflict` (naming the option in
  camelCase) when two names of one option are given different values (never a silent pick);
- **unknown options are refused** (:func:`refuse_unknown`, :class:`UnknownOption`, naming the
  nearest known option): an ignored cap (Spark's Kafka ``maxOffsetsPerTrigger``) or credential
  (StreamNative's ``pulsar.client.authPluginClassName``) would change what a job does silently;
- **connection security**: ``authToken`` (a token, or ``file:///path`` to a file holding one,
  read at each connect); OAuth2 client credentials ``authOauth2IssuerUrl`` with
  ``authOauth2ClientId`` + ``authOauth2ClientSecret`` or ``authOauth2PrivateKey`` (a credentials
  file), and optional ``authOauth2Audience``, ``authOauth2Scope``; basic ``authBasicUsername`` +
  ``authBasicPassword``; a TLS client certificate ``tlsCertificateFilePath`` + ``tlsKeyFilePath``
  (alone, it authenticates); ``tlsTrustCertsFilePath``, ``tlsAllowInsecureConnection`` and
  ``tlsValidateHostname``. :func:`broker_settings` turns them, with the URLs, into a
  :class:`txn.settings.BrokerSettings`, whose ``client_kwargs()`` and ``admin_kwargs()`` every
  client and admin call of the source, the sink and the runtime use. ``BrokerSettings`` is a
  frozen dataclass: it pickles into Spark tasks as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from txn.settings import BrokerSettings, SettingsError

__all__ = [
    "CONNECTION_ALIASES",
    "FOREIGN_OPTIONS",
    "SECURITY_OPTIONS",
    "OptionConflict",
    "OptionError",
    "UnknownOption",
    "broker_settings",
    "camel_aliases",
    "camel_case",
    "lower_options",
    "parse_bool",
    "refuse_unknown",
    "resolve_aliases",
    "settings_options",
]

#: Internal (lower-case) option key -> the other names accepted for it, on every face. Users write
#: ``serviceUrl`` and ``adminUrl`` (Spark's camelCase); ``service_url``/``admin_url`` are the older
#: names, ``service.url``/``admin.url`` StreamNative's.
CONNECTION_ALIASES: dict[str, tuple[str, ...]] = {
    "service_url": ("service.url", "serviceurl"),
    "admin_url": ("admin.url", "adminurl"),
}


def camel_case(name: str) -> str:
    """``txn_timeout_ms`` -> ``txnTimeoutMs``: the option style of Spark's own sources (names
    without an underscore are returned as they are)."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def camel_aliases(internal: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """For option keys kept in snake case internally (the older names), the camelCase spelling
    users write, lower-cased as Spark hands it over: ``{"txn_timeout_ms": ("txntimeoutms",)}``."""
    return {k: (camel_case(k).lower(),) for k in internal}

#: Option -> :class:`txn.settings.BrokerSettings` field, for the string-valued credentials.
_CREDENTIAL_OPTIONS: dict[str, str] = {
    "authOauth2IssuerUrl": "auth_oauth2_issuer_url",
    "authOauth2ClientId": "auth_oauth2_client_id",
    "authOauth2ClientSecret": "auth_oauth2_client_secret",
    "authOauth2PrivateKey": "auth_oauth2_private_key",
    "authOauth2Audience": "auth_oauth2_audience",
    "authOauth2Scope": "auth_oauth2_scope",
    "authBasicUsername": "auth_basic_username",
    "authBasicPassword": "auth_basic_password",
    "tlsCertificateFilePath": "tls_certificate_file_path",
    "tlsKeyFilePath": "tls_private_key_file_path",
}

#: The security options, as users write them (Spark matches them case-insensitively).
SECURITY_OPTIONS = ("authToken", "tlsTrustCertsFilePath", "tlsAllowInsecureConnection", "tlsValidateHostname",
                    *_CREDENTIAL_OPTIONS)

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class OptionError(ValueError):
    """An option of a ``spark_jobs`` data source is missing, malformed or contradicts another."""


class UnknownOption(OptionError):
    """An option this data source does not know: refused, with the nearest known name, rather than
    ignored (an ignored cap or credential changes what the job does without a word)."""

    def __init__(self, option: str, face: str, message: str) -> None:
        self.option = option
        super().__init__(message)


#: Options of other connectors users bring along, and what to use here instead.
FOREIGN_OPTIONS: dict[str, str] = {
    "maxoffsetspertrigger": ("Spark's Kafka source caps batches by offsets; here the caps are maxMessagesPerTrigger "
                             "and maxBytesPerTrigger"),
    "kafka.bootstrap.servers": "this is the Pulsar source; give service_url (pulsar://host:6650)",
    "subscribe": "name the topics with topics (comma-separated) or topicsPattern",
    "subscribepattern": "name the topics with topicsPattern",
}
#: Prefixes of StreamNative's client settings; authentication goes through authToken and the TLS options.
_STREAMNATIVE = ("pulsar.client.", "pulsar.reader.", "pulsar.producer.", "pulsar.admin.")


def refuse_unknown(o: Mapping[str, Any], known: Iterable[str], face: str, internal: Iterable[str] = ()) -> None:
    """Raise :class:`UnknownOption` for the first option of ``o`` (lower-case names, aliases folded)
    that is neither in ``known`` (names as users write them) nor one of the ``internal`` keys
    aliases are folded into, naming the nearest known one."""
    import difflib

    names = {k.lower(): k for k in known}
    accepted = set(names) | {k.lower() for k in internal}
    for key in sorted(o):
        if key in accepted:
            continue
        if key in FOREIGN_OPTIONS:
            raise UnknownOption(key, face, f"unknown option {key} of the {face}: {FOREIGN_OPTIONS[key]}")
        if key.startswith(_STREAMNATIVE):
            raise UnknownOption(key, face, (
                f"unknown option {key} of the {face}: StreamNative's client settings are not read here; "
                f"authenticate with authToken (a token, or file:///path), the OAuth2 options authOauth2*, "
                f"authBasicUsername/authBasicPassword or a client certificate (tlsCertificateFilePath, "
                f"tlsKeyFilePath), and the TLS options tlsTrustCertsFilePath, tlsAllowInsecureConnection, "
                f"tlsValidateHostname"))
        near = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
        hint = f"; did you mean {names[near[0]]}?" if near else ""
        raise UnknownOption(key, face, f"unknown option {key} of the {face}{hint} (known: "
                                       f"{', '.join(sorted(set(names.values()), key=str.lower))})")


class OptionConflict(OptionError):
    """Two names for one option (an alias and its canonical name) were given different values."""

    def __init__(self, option: str, given: Mapping[str, str]) -> None:
        self.option = option
        self.given = dict(given)
        shown = ", ".join(f"{k}={v!r}" for k, v in self.given.items())
        super().__init__(f"option {option} is given under several names with different values ({shown}); "
                         f"give it once")


def lower_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Spark's options with lower-case names and ``None`` values dropped."""
    return {str(k).lower(): v for k, v in dict(options or {}).items() if v is not None}


def resolve_aliases(o: dict[str, Any], aliases: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """Fold aliases into their canonical names in ``o`` (lower-case names, changed in place and
    returned); :class:`OptionConflict` when names of one option carry different values."""
    for canonical, names in aliases.items():
        given = {n: o[n] for n in (canonical, *names) if n in o}
        if not given:
            continue
        values = {str(v).strip() for v in given.values()}
        if len(values) > 1:
            raise OptionConflict(camel_case(canonical), {k: str(v) for k, v in given.items()})
        for n in names:
            o.pop(n, None)
        o[canonical] = next(iter(given.values()))
    return o


def parse_bool(value: Any, option: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no, on/off) -> bool, else :class:`OptionError`."""
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise OptionError(f"option {option} must be true or false, got {value!r}")


def broker_settings(o: Mapping[str, Any], who: str = "spark_jobs") -> BrokerSettings:
    """The connection settings in options ``o`` (lower-case names, aliases resolved).

    ``service_url`` is required; ``authToken`` is a token or ``file:///path``; the other
    credentials are in :data:`SECURITY_OPTIONS`. Raises :class:`OptionError` naming the option.
    """
    url = str(o.get("service_url") or "").strip()
    if not url:
        raise OptionError(f"the {who} needs the option serviceUrl (aliases service_url, service.url), "
                          "e.g. pulsar://127.0.0.1:6650")
    admin = str(o.get("admin_url") or "").strip().rstrip("/") or None
    token = str(o.get("authtoken") or "").strip() or None
    token_file = None
    if token and token.startswith("file://"):
        token_file, token = token[len("file://"):], None
    try:
        return BrokerSettings(
            service_url=url,
            admin_url=admin,
            auth_token=token,
            auth_token_file=token_file,
            tls_trust_certs_file_path=str(o.get("tlstrustcertsfilepath") or "").strip() or None,
            tls_validate_hostname=parse_bool(o.get("tlsvalidatehostname", "false"), "tlsValidateHostname"),
            tls_allow_insecure_connection=parse_bool(o.get("tlsallowinsecureconnection", "false"),
                                                     "tlsAllowInsecureConnection"),
            **_credentials(o),
        )
    except SettingsError as exc:
        raise OptionError(f"the {who}'s connection options: {exc}") from None


def _credentials(o: Mapping[str, Any]) -> dict[str, str]:
    """The :data:`_CREDENTIAL_OPTIONS` given in ``o`` as settings fields (passwords and secrets as
    given, the rest stripped; empty ones left out)."""
    out = {}
    for opt, name in _CREDENTIAL_OPTIONS.items():
        raw = o.get(opt.lower())
        if raw is None or not str(raw).strip():
            continue
        out[name] = str(raw) if name in ("auth_oauth2_client_secret", "auth_basic_password") else str(raw).strip()
    return out


def settings_options(settings: BrokerSettings) -> dict[str, str]:
    """The Spark options that carry ``settings`` (the inverse of :func:`broker_settings`): what a
    driver passes to the ``pulsar`` source or the ``pulsar-txn`` sink it builds a plan on."""
    o: dict[str, str] = {"service_url": settings.require_service_url()}
    if settings.admin_url:
        o["admin_url"] = settings.admin_url
    if settings.auth_token_file:
        o["authToken"] = "file://" + settings.auth_token_file
    elif settings.auth_token:
        o["authToken"] = settings.auth_token
    if settings.tls_trust_certs_file_path:
        o["tlsTrustCertsFilePath"] = settings.tls_trust_certs_file_path
    if settings.tls_allow_insecure_connection:
        o["tlsAllowInsecureConnection"] = "true"
    if settings.tls_validate_hostname:
        o["tlsValidateHostname"] = "true"
    for opt, f in _CREDENTIAL_OPTIONS.items():
        value = getattr(settings, f)
        if value:
            o[opt] = value
    return o
