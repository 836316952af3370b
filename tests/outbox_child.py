"""Child process for the kill -9 outbox test (run by tests/test_reliable_producer.py).

``outbox_child.py SERVICE_URL ADMIN_URL TOPIC OUTBOX PRODUCER_NAME N``

Sends messages ``0..N-1`` (payload and property ``id`` = the number) through a
``ReliableProducer`` with a durable outbox. Each message carries ``checkpoint=str(i)``,
committed in the same SQLite transaction as its row, so after a crash the outbox
knows exactly which ids were accepted: a rerun starts at ``checkpoint + 1`` (the
rows left over are re-sent by the producer itself when it starts). Prints:

    start <first id> rows=<left over> already_stored=<k> resent=<m>
    accepted <i>          (after send_async returned: row fsynced)
    done next_seq=<s>     (after every message is confirmed)
"""

from __future__ import annotations

import sys

import txn
from txn.delivery.reliable_producer import ReliableProducer


def main() -> int:
    service_url, admin_url, topic, outbox, name, n = sys.argv[1:7]
    client = txn.Client(service_url)
    p = ReliableProducer(
        client, topic, window=200, outbox_path=outbox, producer_name=name, admin_url=admin_url,
        require_dedup=True, batching_max_publish_delay_ms=20,
    )
    start = int(p.checkpoint() or -1) + 1
    r = p.recovery
    print(f"start {start} rows={r['rows']} already_stored={r['already_stored']} resent={r['resent']}", flush=True)
    for i in range(start, int(n)):
        p.send_async(str(i).encode(), properties={"id": str(i)}, checkpoint=str(i))
        print(f"accepted {i}", flush=True)
    p.flush()
    print(f"done next_seq={p.next_sequence_id}", flush=True)
    p.close()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
