"""``ProtobufNativeSchema`` against ``pulsar.schema.ProtobufNativeSchema``: the same registered
definition for the same generated message class (its file and imports as a FileDescriptorSet),
the same bytes, and through the broker both ways."""

from __future__ import annotations

import base64
import json

import pulsar
import pulsar.schema as ps
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

import txn
import txn.schema as ts
from txn.protocol import pb

from peer import read_n


def _field(msg, name, number, ftype, label=F.LABEL_OPTIONAL, type_name=None):
    f = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name


def _classes():
    """Generated classes of two .proto files in their own pool: shop/order.proto imports
    shop/common.proto and google/protobuf/timestamp.proto."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    common = descriptor_pb2.FileDescriptorProto(name="shop/common.proto", package="shop", syntax="proto3")
    money = common.message_type.add(name="Money")
    _field(money, "currency", 1, F.TYPE_STRING)
    _field(money, "cents", 2, F.TYPE_INT64)
    pool.Add(common)
    order = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3",
                                               dependency=["shop/common.proto", "google/protobuf/timestamp.proto"])
    m = order.message_type.add(name="Order")
    _field(m, "id", 1, F.TYPE_INT32)
    _field(m, "lines", 2, F.TYPE_STRING, F.LABEL_REPEATED)
    _field(m, "total", 3, F.TYPE_MESSAGE, type_name=".shop.Money")
    _field(m, "at", 4, F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    pool.Add(order)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Money")))


Order, Money = _classes()


def _orders():
    a = Order(id=1, lines=["tea", "cake"])
    a.total.currency, a.total.cents = "EUR", 450
    a.at.seconds = 1_700_000_000
    return [a, Order(id=2), Order()]


# ------------------------------------------------------------------------------------------ no broker


@pytest.mark.parametrize("cls", [Order, Money, timestamp_pb2.Timestamp, pb.KeyValue], ids=lambda c: c.__name__)
def test_definition_is_the_official(cls):
    o, t = ps.ProtobufNativeSchema(cls).schema_info(), ts.ProtobufNativeSchema(cls).schema_info()
    assert t.schema() == o.schema()
    assert t.name() == o.name() == "PROTOBUF_NATIVE"
    assert t.schema_type() == int(o.schema_type()) == 20


def test_definition_holds_the_file_and_its_imports_dependencies_first():
    d = json.loads(ts.ProtobufNativeSchema(Order).schema_info().schema())
    assert (d["rootMessageTypeName"], d["rootFileDescriptorName"]) == ("shop.Order", "shop/order.proto")
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(d["fileDescriptorSet"]))
    assert [f.name for f in files.file] == ["shop/common.proto", "google/protobuf/timestamp.proto", "shop/order.proto"]


def test_encodings_are_the_official():
    o, t = ps.ProtobufNativeSchema(Order), ts.ProtobufNativeSchema(Order)
    for v in _orders():
        assert t.encode(v) == o.encode(v) == v.SerializeToString()
        assert t.decode(o.encode(v)) == v
        assert type(t.decode(o.encode(v))) is Order
        assert o.decode(t.encode(v)) == v


def test_bad_input_is_a_type_error_on_both():
    for bad in (dict, 5, Order()):  # not a class, not a message class, an instance
        with pytest.raises(TypeError):
            ps.ProtobufNativeSchema(bad)
        with pytest.raises(TypeError):
            ts.ProtobufNativeSchema(bad)
    with pytest.raises(TypeError):
        ps.ProtobufNativeSchema(Order).encode(Money())
    with pytest.raises(TypeError):
        ts.ProtobufNativeSchema(Order).encode(Money())
    assert str(ts.ProtobufNativeSchema(Order)) == str(ps.ProtobufNativeSchema(Order)) == "ProtobufNativeSchema(Order)"


# ------------------------------------------------------------------------------------------ with the broker


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield c
    c.close()


def test_official_producer_to_our_consumer_and_reader(client, official, topic):
    # Acks nothing: the reader below re-reads from the earliest, and retention none may delete what all subs acked.
    consumer = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest,
                                schema=ts.ProtobufNativeSchema(Order))
    producer = official.create_producer(topic, schema=ps.ProtobufNativeSchema(Order))
    for v in _orders():
        producer.send(v)
    got = [consumer.receive(timeout_millis=20000) for _ in range(3)]
    assert [m.value() for m in got] == _orders()
    assert [m.schema_version() for m in got] == ["\x00" * 8] * 3
    reader = client.create_reader(topic, txn.EARLIEST, schema=ts.ProtobufNativeSchema(Order))
    assert [reader.read_next(20000).value() for _ in range(3)] == _orders()


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
def test_our_producer_to_official_consumer(client, official, topic, batching):
    producer = client.create_producer(topic, schema=ts.ProtobufNativeSchema(Order), batching_enabled=batching)
    consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest,
                                  schema=ps.ProtobufNativeSchema(Order))
    for v in _orders():
        producer.send(v)
    got = read_n(consumer, 3)
    assert [m.value() for m in got] == _orders()
    assert [m.schema_version() for m in got] == ["\x00" * 8] * 3


def test_another_message_type_is_refused_on_both(client, official, topic):
    client.create_producer(topic, schema=ts.ProtobufNativeSchema(Order)).close()
    with pytest.raises(txn.IncompatibleSchema):
        client.create_producer(topic, schema=ts.StringSchema())
    with pytest.raises(pulsar.IncompatibleSchema):
        official.create_producer(topic, schema=ps.StringSchema())
    # the same class from the official client is the same schema: let in
    official.create_producer(topic, schema=ps.ProtobufNativeSchema(Order)).close()
