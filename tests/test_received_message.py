"""``ReceivedMessage`` sets its fields in one ``__init__`` (it runs once per received message): it must
set every field ``Message`` declares, and its properties dict is made on first use. No broker."""

from __future__ import annotations

from txn.message import Message, MessageId, ReceivedMessage, id_text, position


def _received(properties: dict[str, str] | None) -> ReceivedMessage:
    return ReceivedMessage(b"v", properties, (7, 8, 2, 10), 3, "persistent://t/n/x-partition-2", "k", 11, 12, 1,
                           "prod", 99, None, None, b"o")


def test_every_field_of_message_is_set() -> None:
    m = _received(None)
    slots = [s for cls in (Message, ReceivedMessage) for s in cls.__slots__
             if s not in ("raw_schema_version", "encryption")]  # set only on messages that have them
    assert [s for s in slots if not hasattr(m, s)] == []
    assert (m.data(), m.partition_key(), m.publish_timestamp(), m.event_timestamp(), m.redelivery_count(),
            m.producer_name(), m.topic_name()) == (b"v", "k", 11, 12, 1, "prod", "persistent://t/n/x-partition-2")
    assert m.message_id() == MessageId(2, 7, 8, 3)
    assert m.message_id().batch_size == 10


def test_properties_are_made_on_first_use_and_kept() -> None:
    m = _received(None)
    assert m.properties() == {}
    m.properties()["a"] = "b"  # as before: the message's own dict
    assert m.properties() == {"a": "b"}
    given = {"x": "y"}
    assert _received(given).properties() is given


def test_position_and_id_text_match_the_message_id() -> None:
    m = _received(None)
    mid = m.message_id()
    assert position(m) == (m.topic_name(), mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index())
    assert id_text(m) == str(mid) == "(7,8,2,3)"
    built = Message(b"v", {}, MessageId(1, 5, 6, -1), "t", None, 0, 0, 0, "p", 0)
    assert position(built) == ("t", 5, 6, 1, -1) and id_text(built) == str(built.message_id())
