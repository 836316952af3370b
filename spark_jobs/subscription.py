"""The durable subscription a streaming ``pulsar`` query holds, and how to drop it.

Pulsar keeps a topic's data only for durable subscriptions (or a retention policy). A
streaming query therefore holds one subscription, with the same name on every partition it
reads, and its cursor follows the query's committed offsets. The name is part of the query's
checkpoint: the source writes it into every offset it returns, under :data:`SUBSCRIPTION_KEY`
(next to the ``{topic partition: position}`` entries), so a query restarted from its checkpoint
finds it again. Spark does not tell a Python source its checkpoint location, so a new query
(a fresh checkpoint) gets a new random name (``spark-pulsar-<32 hex>``) unless the option
``subscription`` names one.

A retired query's subscription keeps its unread data forever: drop it with
``pulsar-txn spark drop-subscription --admin-url URL --checkpoint DIR`` (or ``--topic T
--subscription NAME``), which calls :func:`drop_subscription`.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.parse
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txn.admin import admin_request
from txn.topic import parse_topic

#: The key of an offset that names the query's subscription.
SUBSCRIPTION_KEY = "subscription"
_NAME = re.compile(r"[A-Za-z0-9_.:=\-]{1,200}")


def new_subscription_name() -> str:
    """A fresh name for a new query's subscription."""
    return f"spark-pulsar-{uuid.uuid4().hex}"


def check_subscription_name(name: Any, option: str) -> str:
    """``name`` if it is a usable subscription name (``ValueError`` naming ``option`` if not)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name.strip()):
        raise ValueError(f"{option} must be 1-200 characters of letters, digits and _ . : = -, got {name!r}")
    return name.strip()


def split_offset(offset: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the subscription named in a stored offset or None, the partition entries)."""
    rest = {k: v for k, v in offset.items() if k != SUBSCRIPTION_KEY}
    name = offset.get(SUBSCRIPTION_KEY)
    return (str(name) if name else None), rest


def _checkpoint_dir(checkpoint: str) -> Path:
    if "://" in checkpoint or checkpoint.startswith("file:"):
        parsed = urllib.parse.urlparse(checkpoint)
        if parsed.scheme != "file":
            raise ValueError(f"only local checkpoints can be read here, got {checkpoint!r}; "
                             "name the topics and the subscription instead")
        return Path(urllib.parse.unquote(parsed.path))
    return Path(checkpoint)


def checkpoint_subscriptions(checkpoint: str) -> dict[str, list[str]]:
    """The subscriptions the ``pulsar`` sources of a (local) checkpoint hold: {name: partitions}.

    Read from the newest file of the checkpoint's offset log (``<checkpoint>/offsets/<batch>``:
    a version line, a metadata line, then one offset per source, ``-`` for none).
    """
    log = _checkpoint_dir(checkpoint) / "offsets"
    if not log.is_dir():
        raise ValueError(f"{checkpoint}: no offset log ({log} is not a directory)")
    batches = [f for f in log.iterdir() if f.name.isdigit()]
    if not batches:
        raise ValueError(f"{checkpoint}: the offset log {log} is empty")
    newest = max(batches, key=lambda f: int(f.name))
    out: dict[str, list[str]] = {}
    for line in newest.read_text().splitlines()[2:]:
        try:
            offset = json.loads(line)
        except ValueError:
            continue  # "-": a source without an offset
        if isinstance(offset, dict):
            name, parts = split_offset(offset)
            if name:
                out.setdefault(name, []).extend(sorted(parts))
    return out


class DropError(RuntimeError):
    """The admin API refused to delete a subscription (names the topic, subscription and reply)."""


def drop_subscription(admin_url: str, topic: str, subscription: str, token: str | None = None,
                      context: ssl.SSLContext | None = None) -> bool:
    """Delete ``subscription`` from ``topic`` (a topic, a partition or a partitioned topic).

    Returns False if there was nothing to delete (no such topic or subscription). Refused while a
    consumer is connected (a query still running): stop the query first.
    """
    name = parse_topic(topic)
    path = (f"/admin/v2/{name.domain}/{urllib.parse.quote(name.tenant)}/{urllib.parse.quote(name.namespace)}/"
            f"{urllib.parse.quote(name.local)}/subscription/{urllib.parse.quote(subscription, safe='')}")
    status, body = admin_request("DELETE", admin_url, path, token=token, context=context)
    if status in (200, 204):
        return True
    if status == 404:
        return False
    reason = body.get("reason") if isinstance(body, dict) else body
    raise DropError(f"cannot drop subscription {subscription!r} on {name}: HTTP {status} {reason}"
                    + (" (a consumer is connected: stop the query first)" if status == 412 else ""))


__all__ = ["SUBSCRIPTION_KEY", "DropError", "check_subscription_name", "checkpoint_subscriptions",
           "drop_subscription", "new_subscription_name", "split_offset"]
