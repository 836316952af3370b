"""Settings of the control plane, read from ``PULSAR_TXN_*`` environment variables.

The job registry (``PULSAR_TXN_JOBS``, a JSON object, or ``PULSAR_TXN_JOBS_FILE``, a ``.json`` or
``.toml`` file holding the same object; both may be given, names must not repeat) says which jobs
the control plane may replay, with which code and into which topics::

    {"orders/enrich": {"handler": "mypkg.handlers:enrich",
                       "output": "persistent://shop/orders/enriched",
                       "outputs": ["persistent://shop/orders/audit"],
                       "parked_topics": ["persistent://shop/orders/in-parked"]},
     "spark/counts": {"transform": "mypkg.jobs:counts", "output": "persistent://a/b/counts",
                      "parked_topics": ["persistent://a/b/in-parked"]}}

A ledger record only names its job: the code, the output topic and the parking topics come from
here. A batch of a job that is not registered is not replayed.
"""

from __future__ import annotations

import json
import tomllib
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from txn.settings import BrokerSettings, SettingsError
from txn.topic import parse_topic

DEFAULT_DATABASE_URL = "sqlite:///pulsar-txn-api.db"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _topic(v: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("a topic name is required")
    return str(parse_topic(v.strip()))


class JobSpec(BaseModel):
    """One replayable job: its code (a per-message ``handler`` or a Spark ``transform``, each a
    ``module:function``), its default ``output`` topic, other topics its code may write to
    (``outputs``), and the parking topics its batches may come from (``parked_topics``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    handler: str | None = Field(None, description="module:function, called per parked message")
    transform: str | None = Field(None, description="module:function, a Spark DataFrame transform")
    output: str = Field(description="output topic of outputs that name none")
    outputs: tuple[str, ...] = Field((), description="further topics the code may write to")
    parked_topics: tuple[str, ...] = Field(min_length=1, description="parking topics of the job's batches")

    @field_validator("handler", "transform")
    @classmethod
    def _spec(cls, v: str | None) -> str | None:
        if v is not None and (":" not in v or not all(v.split(":", 1))):
            raise ValueError("must be module:function")
        return v

    @field_validator("output")
    @classmethod
    def _output(cls, v: str) -> str:
        return _topic(v)

    @field_validator("outputs", "parked_topics")
    @classmethod
    def _topics(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_topic(t) for t in v)

    @model_validator(mode="after")
    def _one_code(self) -> JobSpec:
        if (self.handler is None) == (self.transform is None):
            raise ValueError("give exactly one of handler and transform")
        return self

    @property
    def allowed_outputs(self) -> frozenset[str]:
        """Every topic the job's code may write to."""
        return frozenset((self.output, *self.outputs))


def parse_jobs(data: Any, source: str) -> dict[str, JobSpec]:
    """The registry in ``data`` (job name -> spec); ValueError naming ``source`` if malformed."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the job registry must be an object of job name -> job spec")
    out = {}
    for name, spec in data.items():
        if not isinstance(name, str) or not 1 <= len(name) <= 256:
            raise ValueError(f"{source}: a job name must be a string of 1..256 characters")
        try:
            out[name] = JobSpec.model_validate(spec)
        except ValueError as exc:
            raise ValueError(f"{source}: job {name!r}: {exc}") from None
    return out


def load_jobs_file(path: str) -> dict[str, JobSpec]:
    """The registry in a ``.json`` or ``.toml`` file."""
    p = Path(path)
    raw = p.read_bytes()
    data = tomllib.loads(raw.decode()) if p.suffix == ".toml" else json.loads(raw)
    return parse_jobs(data, str(p))


class Settings(BaseSettings):
    """Control-plane configuration (environment prefix ``PULSAR_TXN_``)."""

    model_config = SettingsConfigDict(env_prefix="PULSAR_TXN_", extra="ignore")

    service_url: str = Field("pulsar://127.0.0.1:6650", description="Pulsar binary protocol URL")
    admin_url: str = Field("http://127.0.0.1:8080", description="Pulsar admin REST URL")
    auth_token: str = Field("", description="token for the broker (binary protocol and admin REST), if any")
    auth_token_file: str = Field("", description="file holding the broker token (re-read at each connect)")
    #: Older name of ``auth_token`` (``PULSAR_TXN_PULSAR_TOKEN``), still read.
    pulsar_token: str = Field("", description="deprecated: use auth_token")
    tls_trust_certs: str = Field("", description="CA certificates (PEM) for pulsar+ssl:// and https:// broker URLs")
    tls_validate_hostname: bool = Field(False, description="check the broker certificate names its host")
    tls_allow_insecure: bool = Field(False, description="accept any broker certificate (testing only)")
    tls_cert_file: str = Field("", description="client certificate (PEM); alone, it authenticates (TLS auth)")
    tls_key_file: str = Field("", description="private key (PEM) of tls_cert_file")
    auth_oauth2_issuer_url: str = Field("", description="OAuth2 issuer URL (client-credentials grant)")
    auth_oauth2_client_id: str = Field("", description="OAuth2 client id")
    auth_oauth2_client_secret: str = Field("", description="OAuth2 client secret")
    auth_oauth2_private_key: str = Field("", description="OAuth2 credentials file (JSON: client_id, client_secret)")
    auth_oauth2_audience: str = Field("", description="OAuth2 audience")
    auth_oauth2_scope: str = Field("", description="OAuth2 scope")
    auth_basic_username: str = Field("", description="basic authentication user")
    auth_basic_password: str = Field("", description="basic authentication password")
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy URL: an SQLite file or PostgreSQL")
    #: Comma-separated bearer tokens. Mutating endpoints are refused while this is empty.
    api_token: str = Field("", description="bearer token(s) for the API, comma-separated")
    read_requires_token: bool = Field(False, description="also require the token for reads (all but /livez)")
    #: Ledger topics to project. Discovery is off unless namespaces are named in ``discover_namespaces``.
    ledger_topics: str = Field("", description="comma-separated ledger topics")
    discover_namespaces: str = Field("", description="comma-separated tenant/namespace to discover ledger topics in")
    discover_interval_s: float = Field(10.0, gt=0, description="how often to look for new ledger topics")
    projection_batch: int = Field(500, ge=1, le=5000, description="ledger records per database transaction")
    projection_chunk_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024, le=1024**3,
                                        description="bytes of records (decompressed) per database transaction")
    #: A ledger message (or batch entry) that decompresses to more is quarantined with its size,
    #: never decompressed: the client refuses it before decoding.
    projection_max_record_bytes: int = Field(1024 * 1024, ge=4096, le=5 * 1024 * 1024,
                                             description="the largest ledger record projected")
    project: bool = Field(True, description="run the ledger projection in this process")
    slow_txn_ms: int = Field(30_000, ge=0, description="an open transaction older than this is slow")
    #: A ledger-OPEN transaction the coordinator no longer knows, older than this, is marked aborted.
    resolve_after_ms: int = Field(15_000, ge=0, description="grace before resolving vanished open transactions")
    admin_timeout_s: float = Field(10.0, gt=0, description="timeout of admin REST calls")
    jobs: str = Field("", description="job registry: a JSON object of job name -> spec (see the module docs)")
    jobs_file: str = Field("", description="job registry file (.json or .toml)")
    #: Host headers accepted (Starlette's TrustedHostMiddleware); empty: any. ``pulsar-txn api``
    #: sets the loopback names when it binds a loopback address and this is not set.
    trusted_hosts: str = Field("", description="comma-separated accepted Host names ('*' for any)")
    #: Limits of a replay's handler (see :mod:`coordinator_api.handlers`).
    replay_handler_timeout_s: float = Field(60.0, gt=0, le=86400, description="time limit of a handler per input")
    replay_transform_timeout_s: float = Field(600.0, gt=0, le=86400, description="time limit of a transform replay")
    replay_max_outputs: int = Field(10_000, ge=1, le=10_000_000, description="outputs per input")
    replay_max_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=2**34, description="bytes of outputs per input")
    replay_handler_threads: int = Field(4, ge=1, le=256, description="threads running handlers")
    #: /metrics (see :mod:`coordinator_api.metrics`).
    metrics_scrape_budget_s: float = Field(5.0, gt=0, le=300, description="a scrape waits at most this for fresh data")
    metrics_backlog_interval_s: float = Field(15.0, gt=0, le=86400, description="backlogs are read this often")
    metrics_backlog_calls: int = Field(32, ge=1, le=10_000, description="admin calls per backlog refresh")
    metrics_backlog_budget_s: float = Field(2.0, gt=0, le=300, description="time of a backlog refresh's calls")
    #: Limits of ``pulsar-txn api``'s HTTP server (see :mod:`coordinator_api.server`).
    header_timeout_s: float = Field(10.0, gt=0, le=3600, description="a request's headers must arrive within this")
    keep_alive_s: float = Field(5.0, gt=0, le=3600, description="an idle connection is closed after this")
    max_header_bytes: int = Field(65_536, ge=4096, le=16 * 1024 * 1024, description="largest request headers")
    max_connections: int = Field(1000, ge=1, le=1_000_000, description="connections and requests at once (503 beyond)")

    @field_validator("service_url")
    @classmethod
    def _check_service_url(cls, v: str) -> str:
        if not v.startswith(("pulsar://", "pulsar+ssl://")):
            raise ValueError("service_url must start with pulsar:// or pulsar+ssl://")
        return v

    @field_validator("admin_url")
    @classmethod
    def _check_admin_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("admin_url must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("discover_namespaces")
    @classmethod
    def _check_namespaces(cls, v: str) -> str:
        for ns in _split(v):
            if ns.count("/") != 1 or not all(ns.split("/")):
                raise ValueError(f"discover_namespaces: {ns!r} is not tenant/namespace")
        return v

    @model_validator(mode="after")
    def _check_jobs(self) -> Settings:
        _ = self.job_registry  # fail at start-up, not at the first replay
        try:
            _ = self.broker()
        except SettingsError as exc:
            raise ValueError(str(exc)) from exc
        return self

    def broker(self) -> BrokerSettings:
        """The broker connection settings (the model the CLI and the library share)."""
        return BrokerSettings(service_url=self.service_url, admin_url=self.admin_url,
                              auth_token=(self.auth_token or self.pulsar_token) or None,
                              auth_token_file=self.auth_token_file or None,
                              tls_trust_certs_file_path=self.tls_trust_certs or None,
                              tls_validate_hostname=self.tls_validate_hostname,
                              tls_allow_insecure_connection=self.tls_allow_insecure,
                              tls_certificate_file_path=self.tls_cert_file or None,
                              tls_private_key_file_path=self.tls_key_file or None,
                              auth_oauth2_issuer_url=self.auth_oauth2_issuer_url or None,
                              auth_oauth2_client_id=self.auth_oauth2_client_id or None,
                              auth_oauth2_client_secret=self.auth_oauth2_client_secret or None,
                              auth_oauth2_private_key=self.auth_oauth2_private_key or None,
                              auth_oauth2_audience=self.auth_oauth2_audience or None,
                              auth_oauth2_scope=self.auth_oauth2_scope or None,
                              auth_basic_username=self.auth_basic_username or None,
                              auth_basic_password=self.auth_basic_password or None)

    @property
    def tokens(self) -> list[str]:
        """The configured API tokens."""
        return _split(self.api_token)

    @property
    def ledger_topic_list(self) -> list[str]:
        """The configured ledger topics."""
        return _split(self.ledger_topics)

    @property
    def discover_namespace_list(self) -> list[str]:
        """Namespaces in which ledger topics are discovered (empty: no discovery)."""
        return _split(self.discover_namespaces)

    @property
    def trusted_host_list(self) -> list[str]:
        """Accepted Host names (empty: any)."""
        return _split(self.trusted_hosts)

    @cached_property
    def job_registry(self) -> dict[str, JobSpec]:
        """Job name -> spec, from ``jobs`` and ``jobs_file``."""
        reg = parse_jobs(json.loads(self.jobs), "PULSAR_TXN_JOBS") if self.jobs.strip() else {}
        if self.jobs_file:
            for name, spec in load_jobs_file(self.jobs_file).items():
                if name in reg:
                    raise ValueError(f"job {name!r} is in both PULSAR_TXN_JOBS and {self.jobs_file}")
                reg[name] = spec
        return reg


def _split(v: str) -> list[str]:
    return [t.strip() for t in v.split(",") if t.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (read once from the environment)."""
    return Settings()
