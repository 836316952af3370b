"""Settings of the control plane, read from ``PULSAR_TXN_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///pulsar-txn-api.db"


class Settings(BaseSettings):
    """Control-plane configuration (environment prefix ``PULSAR_TXN_``)."""

    model_config = SettingsConfigDict(env_prefix="PULSAR_TXN_", extra="ignore")

    service_url: str = Field("pulsar://127.0.0.1:6650", description="Pulsar binary protocol URL")
    admin_url: str = Field("http://127.0.0.1:8080", description="Pulsar admin REST URL")
    pulsar_token: str = Field("", description="token for the broker (binary protocol and admin REST), if any")
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy URL: an SQLite file or PostgreSQL")
    #: Comma-separated bearer tokens. Mutating endpoints are refused while this is empty.
    api_token: str = Field("", description="bearer token(s) for the API, comma-separated")
    read_requires_token: bool = Field(False, description="also require the token for reads")
    #: Ledger topics to project; empty means: discover every ``pulsar-txn-ledger`` topic.
    ledger_topics: str = Field("", description="comma-separated ledger topics (empty: discover)")
    discover_interval_s: float = Field(10.0, gt=0, description="how often to look for new ledger topics")
    projection_batch: int = Field(500, ge=1, le=5000, description="ledger records per database transaction")
    project: bool = Field(True, description="run the ledger projection in this process")
    slow_txn_ms: int = Field(30_000, ge=0, description="an open transaction older than this is slow")
    #: A ledger-OPEN transaction the coordinator no longer knows, older than this, is marked aborted.
    resolve_after_ms: int = Field(15_000, ge=0, description="grace before resolving vanished open transactions")
    admin_timeout_s: float = Field(10.0, gt=0, description="timeout of admin REST calls")

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

    @property
    def tokens(self) -> list[str]:
        """The configured API tokens."""
        return [t.strip() for t in self.api_token.split(",") if t.strip()]

    @property
    def ledger_topic_list(self) -> list[str]:
        """The configured ledger topics (empty: discover)."""
        return [t.strip() for t in self.ledger_topics.split(",") if t.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (read once from the environment)."""
    return Settings()
