"""``txn.delivery.output.normalise`` bounds a handler's result (issue "No record and no handler can
exhaust, mislead or stall the control plane or the processor", item 5): outputs and bytes per
input, and a deadline for iterating a returned iterable; the error names the limit."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from txn.delivery.output import MAX_OUTPUT_BYTES, MAX_OUTPUTS, Output, OutputLimitExceeded, normalise


def test_the_plain_call_still_works() -> None:
    assert normalise(None) == []
    assert normalise(b"a") == [Output(b"a")]
    assert normalise([b"a", bytearray(b"b"), Output(b"c", "t")]) == [Output(b"a"), Output(b"b"), Output(b"c", "t")]
    assert len(normalise(itertools.repeat(b"x", MAX_OUTPUTS))) == MAX_OUTPUTS  # the default bound, reached exactly
    with pytest.raises(TypeError):
        normalise("text")
    with pytest.raises(TypeError):
        normalise([1])


def test_an_endless_generator_stops_at_the_output_bound() -> None:
    pulled = 0

    def endless() -> Iterator[bytes]:
        nonlocal pulled
        while True:
            pulled += 1
            yield b"x"

    with pytest.raises(OutputLimitExceeded) as e:
        normalise(endless())
    assert (e.value.limit, e.value.value, str(e.value)) == (
        "max_outputs", MAX_OUTPUTS, f"the handler returned more than {MAX_OUTPUTS} outputs for one input")
    assert pulled == MAX_OUTPUTS + 1 and isinstance(e.value, ValueError)
    with pytest.raises(OutputLimitExceeded, match="more than 3 outputs"):
        normalise(endless(), max_outputs=3)


def test_bytes_are_bounded() -> None:
    with pytest.raises(OutputLimitExceeded) as e:
        normalise(itertools.repeat(b"z" * (8 * 1024 * 1024)))
    assert (e.value.limit, e.value.value) == ("max_bytes", MAX_OUTPUT_BYTES)
    with pytest.raises(OutputLimitExceeded, match="more than 10 bytes"):
        normalise(b"01234567890", max_bytes=10)
    with pytest.raises(OutputLimitExceeded, match="more than 10 bytes"):  # keys and properties count
        normalise([Output(b"1234", partition_key="k", properties={"ab": "cdef"})], max_bytes=10)
    assert normalise([Output(b"123", partition_key="k", properties={"ab": "cd"})], max_bytes=10)


def test_a_deadline_stops_the_iteration() -> None:
    def slow() -> Iterator[bytes]:
        while True:
            time.sleep(0.05)
            yield b"y"

    t0 = time.monotonic()
    with pytest.raises(OutputLimitExceeded) as e:
        normalise(slow(), deadline=time.monotonic() + 0.3)
    assert e.value.limit == "deadline" and time.monotonic() - t0 < 2
