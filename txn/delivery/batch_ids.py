"""Every form of batch id the ledger holds: how each is built, and how each is parsed back.

A batch id is the key of a batch's ledger records (the message key), so it is the ledger's
lookup key. The forms:

========================  ==================================  ================================
writer                    form                                built by
========================  ==================================  ================================
processor batch           ``<job>:<instance>:<seq>``          :func:`processor_batch_id`
narrowed half             ``<parent>.0`` / ``<parent>.1``     :func:`narrowed_batch_id`
Spark sink, one write     ``<job>:<write id>``                :func:`write_batch_id`
Spark micro-batch         ``<job>:<query>:<batch>``           :func:`micro_batch_id`
Spark stream placeholder  ``<job>:<query>:next``              :func:`stream_next_id`
========================  ==================================  ================================

The Spark runtime (both modes) uses the processor form; its distributed mode narrows by entry
ranges and keeps the same ``.0`` / ``.1`` suffixes.

A processor batch that keeps failing is narrowed into halves, recursively (``j:ab12cd34:7.1.0``);
messages parked from any half are parked under the root batch id (``j:ab12cd34:7``). The Spark
sink's micro-batch id carries the query's identity (``stream_key``) and Spark's batch number;
the placeholder is the ``STARTED`` record of a micro-batch's transaction, written before the
batch number is known (the control plane leaves it out of the batch view).

Jobs and query ids are names chosen by users and may contain ``:``; the parts the library
generates never do. So the processor form parses on its own (instance and sequence are the last
two ``:`` parts), and the Spark forms parse given the job (they start with ``<job>:``). The forms
overlap in shape (a micro-batch of query ``ab12cd34`` looks like a processor batch): parse an id
with the parser of the form its writer uses.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The batch number of the Spark sink's stream placeholder.
NEXT = "next"


def _part(name: str, value: str, forbidden: str) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in forbidden):
        without = f" without {' or '.join(repr(c) for c in forbidden)}" if forbidden else ""
        raise ValueError(f"{name} must be a non-empty string{without}, got {value!r}")
    return value


# ------------------------------------------------------------------------- processor


@dataclass(frozen=True, slots=True)
class ProcessorBatchId:
    """A processor batch id, parsed: ``halves`` is the narrowing path (``(1, 0)`` for ``….1.0``)."""

    job: str
    instance: str
    seq: int
    halves: tuple[int, ...] = ()

    @property
    def root(self) -> str:
        """The id of the batch this one was narrowed from (itself if not narrowed)."""
        return processor_batch_id(self.job, self.instance, self.seq)

    def __str__(self) -> str:
        bid = self.root
        for h in self.halves:
            bid = narrowed_batch_id(bid, h)
        return bid


def processor_batch_id(job: str, instance: str, seq: int) -> str:
    """``<job>:<instance>:<seq>``: batch ``seq`` (from 1) of processor ``instance`` of ``job``."""
    _part("instance", instance, ":.")
    if type(seq) is not int or seq < 0:
        raise ValueError(f"seq must be a non-negative integer, got {seq!r}")
    return f"{job}:{instance}:{seq}"


def narrowed_batch_id(batch_id: str, half: int) -> str:
    """``<batch_id>.<half>``: the first (0) or second (1) half of a batch being narrowed."""
    if half not in (0, 1) or type(half) is not int:
        raise ValueError(f"half must be 0 or 1, got {half!r}")
    return f"{batch_id}.{half}"


def parse_processor_batch_id(batch_id: str) -> ProcessorBatchId | None:
    """The parts of a processor batch id (narrowed or not), or None if it is not of that form."""
    job, sep, rest = batch_id.rpartition(":")
    job, sep2, instance = job.rpartition(":")
    if not (sep and sep2 and instance) or "." in instance:
        return None
    seq, *halves = rest.split(".")
    if not _digits(seq) or not all(h in ("0", "1") for h in halves):
        return None
    return ProcessorBatchId(job, instance, int(seq), tuple(int(h) for h in halves))


def is_narrowed_from(batch_id: str, root: str) -> bool:
    """Whether ``batch_id`` is a half (at any depth) of batch ``root``."""
    if not batch_id.startswith(root + "."):
        return False
    return all(h in ("0", "1") for h in batch_id[len(root) + 1:].split("."))


# ----------------------------------------------------------------------------- Spark


@dataclass(frozen=True, slots=True)
class WriteBatchId:
    """A Spark sink batch write's id, parsed."""

    job: str
    write_id: str

    def __str__(self) -> str:
        return write_batch_id(self.job, self.write_id)


@dataclass(frozen=True, slots=True)
class MicroBatchId:
    """A Spark micro-batch id (or the stream placeholder: ``batch`` None), parsed."""

    job: str
    query: str
    batch: int | None

    @property
    def is_placeholder(self) -> bool:
        """True for the stream placeholder (``…:next``)."""
        return self.batch is None

    def __str__(self) -> str:
        if self.batch is None:
            return stream_next_id(self.job, self.query)
        return micro_batch_id(self.job, self.query, self.batch)


def write_batch_id(job: str, write_id: str) -> str:
    """``<job>:<write id>``: one batch write (``df.write``) of the Spark sink."""
    return f"{job}:{_part('write id', write_id, ':')}"


def micro_batch_id(job: str, query: str, batch: int) -> str:
    """``<job>:<query>:<batch>``: micro-batch ``batch`` of streaming query ``query`` (its stream key)."""
    if type(batch) is not int or batch < 0:
        raise ValueError(f"batch must be a non-negative integer, got {batch!r}")
    return f"{job}:{_part('query', query, '')}:{batch}"


def stream_next_id(job: str, query: str) -> str:
    """``<job>:<query>:next``: the placeholder of query ``query``'s next micro-batch."""
    return f"{job}:{_part('query', query, '')}:{NEXT}"


def parse_write_batch_id(batch_id: str, job: str) -> WriteBatchId | None:
    """The parts of a sink write's id of ``job``, or None if it is not of that form."""
    if not batch_id.startswith(job + ":"):
        return None
    write_id = batch_id[len(job) + 1:]
    if not write_id or ":" in write_id:
        return None
    return WriteBatchId(job, write_id)


def parse_micro_batch_id(batch_id: str, job: str) -> MicroBatchId | None:
    """The parts of a micro-batch id (or stream placeholder) of ``job``, or None if it is not one."""
    if not batch_id.startswith(job + ":"):
        return None
    query, sep, batch = batch_id[len(job) + 1:].rpartition(":")
    if not sep or not query:
        return None
    if batch == NEXT:
        return MicroBatchId(job, query, None)
    if not _digits(batch):
        return None
    return MicroBatchId(job, query, int(batch))


def is_stream_next(batch_id: str) -> bool:
    """Whether ``batch_id`` has the stream placeholder's shape (``…:next``), whatever its job."""
    return batch_id.endswith(":" + NEXT)


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit() and (s == "0" or not s.startswith("0"))
