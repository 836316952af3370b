"""The end-to-end transactional example behind ``pulsar-txn demo``.

It writes inside transactions with ``txn`` and reads with the official
``pulsar-client`` as an independent witness, printing what each side saw.
"""

from __future__ import annotations

import time
import uuid

import pulsar

import txn


def _peek(consumer: pulsar.Consumer, wait_ms: int) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + wait_ms / 1000.0
    while True:
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0:
            return out
        try:
            m = consumer.receive(timeout_millis=left)
        except pulsar.Timeout:
            return out
        consumer.acknowledge(m)
        out.append(m.data())


def run_demo(service_url: str, admin_url: str | None = None) -> int:
    """Run the demo against ``service_url``; returns a process exit code."""
    run = uuid.uuid4().hex[:6]
    inp = f"persistent://public/default/demo-orders-{run}"
    out = f"persistent://public/default/demo-invoices-{run}"
    print(f"broker: {service_url}\ninput topic: {inp}\noutput topic: {out}\n")
    witness = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    seen_out = witness.subscribe(out, "witness", initial_position=pulsar.InitialPosition.Earliest)
    ok = True
    with txn.Client(service_url) as client:
        # 1. Some input, written without a transaction.
        feeder = client.create_producer(inp)
        for i in range(5):
            feeder.send(f"order-{i}".encode())
        print("1. wrote 5 orders to the input topic")
        worker = client.subscribe(inp, "billing", initial_position=txn.InitialPosition.Earliest)
        producer = client.create_producer(out)

        # 2. consume -> transform -> produce, acks and outputs in one transaction.
        t = client.new_transaction(timeout_millis=30000)
        print(f"2. opened transaction {t.id} ({t.state.value})")
        for _ in range(5):
            m = worker.receive(10000)
            producer.send(m.data().replace(b"order", b"invoice"), txn=t)
            worker.acknowledge(m, txn=t)
        before = _peek(seen_out, 1500)
        print(f"   before commit the official client sees {len(before)} invoices: {before}")
        t.commit()
        after = _peek(seen_out, 3000)
        print(f"   committed {t.id} ({t.state.value}); the official client now sees {len(after)}: {after}")
        ok &= before == [] and after == [f"invoice-{i}".encode() for i in range(5)]

        # 3. An aborted transaction leaves nothing behind, and its inputs come back.
        for i in range(5, 8):
            feeder.send(f"order-{i}".encode())
        t2 = client.new_transaction(timeout_millis=30000)
        taken = []
        for _ in range(3):
            m = worker.receive(10000)
            taken.append(m.data())
            producer.send(m.data().replace(b"order", b"invoice"), txn=t2)
            worker.acknowledge(m, txn=t2)
        t2.abort()
        leftover = _peek(seen_out, 2000)
        print(f"3. aborted {t2.id} ({t2.state.value}) after processing {taken}")
        print(f"   outputs the abort left behind: {leftover}")
        back = sorted(worker.receive(10000).data() for _ in range(3))
        print(f"   inputs redelivered after the abort: {back}")
        ok &= leftover == [] and back == sorted(taken)

        # 4. A transaction the broker times out.
        t3 = client.new_transaction(timeout_millis=1500)
        producer.send(b"never-visible", txn=t3)
        time.sleep(3)
        try:
            t3.commit()
            print("4. UNEXPECTED: a timed-out transaction committed")
            ok = False
        except txn.TransactionTimedOut as exc:
            print(f"4. transaction {t3.id} outlived its 1500 ms timeout: {type(exc).__name__}: {exc}")
        ok &= _peek(seen_out, 1500) == []
    witness.close()
    print("\nresult:", "OK — exactly the committed outputs are visible" if ok else "FAILED")
    print("(the broker keeps running; stop it with: pulsar-txn broker stop)")
    return 0 if ok else 1
