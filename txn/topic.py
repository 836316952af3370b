"""Topic-name parsing and validation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidTopicName

_PART = re.compile(r"[A-Za-z0-9_=:.\-]+")
_LOCAL = re.compile(r"[A-Za-z0-9_=:.\-%]+")
PARTITION_SUFFIX = "-partition-"


@dataclass(frozen=True, slots=True)
class TopicName:
    """A fully qualified topic name: ``domain://tenant/namespace/local``."""

    domain: str
    tenant: str
    namespace: str
    local: str

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def partition_index(self) -> int:
        """The partition number, or -1 if this is not a partition topic."""
        head, sep, tail = self.local.rpartition(PARTITION_SUFFIX)
        if sep and head and tail.isdigit():
            return int(tail)
        return -1

    @property
    def base(self) -> str:
        """The name without a ``-partition-N`` suffix."""
        if self.partition_index >= 0:
            return str(self).rpartition(PARTITION_SUFFIX)[0]
        return str(self)

    def partition(self, index: int) -> str:
        """The name of partition ``index`` of this topic."""
        return f"{self}{PARTITION_SUFFIX}{index}"


def parse_topic(name: object) -> TopicName:
    """Parse and validate a topic name; short forms get ``persistent://public/default``.

    Raises :class:`~txn.InvalidTopicName` on anything malformed.
    """
    if not isinstance(name, str) or not name or name != name.strip():
        raise InvalidTopicName(f"invalid topic name {name!r}", topic=str(name))
    if "://" in name:
        domain, _, rest = name.partition("://")
        if domain not in ("persistent", "non-persistent"):
            raise InvalidTopicName(f"invalid topic domain {domain!r}", topic=name)
    else:
        domain, rest = "persistent", name
    parts = rest.split("/")
    if len(parts) == 1:
        tenant, namespace, local = "public", "default", parts[0]
    elif len(parts) == 3:
        tenant, namespace, local = parts
    else:
        raise InvalidTopicName(
            f"invalid topic name {name!r}: expected [domain://]tenant/namespace/topic or a bare name",
            topic=name,
        )
    if not _PART.fullmatch(tenant) or not _PART.fullmatch(namespace):
        raise InvalidTopicName(f"invalid tenant or namespace in {name!r}", topic=name)
    if not local or not _LOCAL.fullmatch(local):
        raise InvalidTopicName(f"invalid local topic name in {name!r}", topic=name)
    return TopicName(domain, tenant, namespace, local)
