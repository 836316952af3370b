"""Live state from the broker's admin REST API (transactions, coordinators, ledger topics)."""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

from txn.admin import admin_request, topic_path
from txn.auth import Authentication
from txn.delivery.ledger import LEDGER_TOPIC_NAME
from txn.message import TxnID
from txn.topic import parse_topic


class LiveError(Exception):
    """The broker's admin API could not be reached or answered an unexpected status."""


@dataclass(slots=True)
class Live:
    """Read-only views of the broker's transaction state."""

    admin_url: str
    token: str | Authentication | None = None
    timeout: float = 5.0
    context: ssl.SSLContext | None = None

    def _get(self, path: str, ok_missing: bool = False) -> Any:
        try:
            status, body = admin_request("GET", self.admin_url, path, timeout=self.timeout, token=self.token,
                                         context=self.context)
        except OSError as exc:
            raise LiveError(f"broker admin API {self.admin_url} unreachable: {exc}") from exc
        if status == 404 and ok_missing:
            return None
        if status != 200:
            reason = body.get("reason") if isinstance(body, dict) else body
            raise LiveError(f"GET {path} -> HTTP {status}: {reason}")
        return body

    def ping(self) -> str:
        """The broker's cluster list, as a reachability check (raises LiveError)."""
        return ",".join(self._get("/admin/v2/clusters") or [])

    def coordinator_stats(self) -> list[dict[str, Any]]:
        """One entry per transaction coordinator: id, state, ongoing transactions, low watermark."""
        stats = self._get("/admin/v3/transactions/coordinatorStats") or {}
        out = []
        for cid, s in sorted(stats.items(), key=lambda kv: int(kv[0])):
            out.append({
                "coordinator_id": int(cid), "state": s.get("state"), "ongoing": s.get("ongoingTxnSize"),
                "low_water_mark": s.get("lowWaterMark"), "recover_start_ms": s.get("recoverStartTime"),
                "recover_end_ms": s.get("recoverEndTime"),
            })
        return out

    def txn_metadata(self, txn_id: str | TxnID) -> dict[str, Any] | None:
        """The coordinator's metadata of a live transaction, or None once it has ended."""
        t = txn_id if isinstance(txn_id, TxnID) else TxnID.parse(txn_id)
        if t.most >= 2**31:  # coordinator ids are partition numbers; the broker answers 500 for these
            return None
        meta = self._get(f"/admin/v3/transactions/transactionMetadata/{t.most}/{t.least}", ok_missing=True)
        return None if meta is None else shape_metadata(meta)

    def slow_transactions(self, older_than_ms: int) -> list[dict[str, Any]]:
        """Open transactions older than ``older_than_ms``, oldest first."""
        body = self._get(f"/admin/v3/transactions/slowTransactions/{int(older_than_ms)}") or {}
        return sorted((shape_metadata(m) for m in body.values()), key=lambda m: m["opened_at_ms"] or 0)

    def buffer_stats(self, topic: str) -> dict[str, Any] | None:
        """The transaction buffer of ``topic`` (None if the topic is not loaded)."""
        return self._get(f"/admin/v3/transactions/transactionBufferStats/{_topic_path(topic)}", ok_missing=True)

    def pending_ack_stats(self, topic: str, subscription: str) -> dict[str, Any] | None:
        """The pending-ack store of ``subscription`` on ``topic`` (None if not loaded)."""
        sub = urllib.parse.quote(subscription, safe="")
        return self._get(f"/admin/v3/transactions/pendingAckStats/{_topic_path(topic)}/{sub}", ok_missing=True)

    def subscription_backlog(self, topic: str, subscription: str) -> tuple[int | None, int]:
        """(``subscription``'s backlog on ``topic`` or None if either does not exist, admin calls
        made): the topic's stats, or for a partitioned topic the sum over its partitions."""
        base = "/admin/v2/" + topic_path(str(parse_topic(topic)))
        body, calls = self._get(base + "/stats", ok_missing=True), 1
        if body is None:
            body, calls = self._get(base + "/partitioned-stats", ok_missing=True), 2
        if not isinstance(body, dict):
            return None, calls
        sub = (body.get("subscriptions") or {}).get(subscription)
        if not isinstance(sub, dict):
            return None, calls
        return int(sub.get("msgBacklog") or 0), calls

    def ledger_topics(self, namespaces: list[str]) -> list[str]:
        """The persistent topics named ``pulsar-txn-ledger`` in ``namespaces`` (``tenant/namespace``)."""
        found: list[str] = []
        for ns in namespaces:
            tenant, _, name = ns.partition("/")
            path = f"{urllib.parse.quote(tenant, safe='')}/{urllib.parse.quote(name, safe='')}"
            topics = self._get(f"/admin/v2/persistent/{path}", ok_missing=True) or []
            found.extend(t for t in topics if isinstance(t, str) and t.rsplit("/", 1)[-1] == LEDGER_TOPIC_NAME
                         and t.startswith(f"persistent://{ns}/"))
        return sorted(set(found))


def _topic_path(topic: str) -> str:
    t = parse_topic(topic)
    return f"{t.tenant}/{t.namespace}/{urllib.parse.quote(t.local, safe='')}"


def shape_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """The coordinator's transaction metadata in the API's field names."""
    opened = meta.get("openTimestamp")
    produced = meta.get("producedPartitions") or {}
    acked = meta.get("ackedPartitions") or {}
    return {
        "txn_id": meta.get("txnId"), "status": meta.get("status"), "opened_at_ms": opened,
        "timeout_ms": meta.get("timeoutAt"),
        "produced_partitions": sorted(produced),
        "acked_subscriptions": sorted(f"{topic}:{sub}" for topic, subs in acked.items() for sub in (subs or {})),
    }
