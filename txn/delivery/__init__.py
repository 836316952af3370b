"""Reliable-delivery building blocks on top of the ``txn`` client.

- :mod:`.processor`: consume → transform → produce, one transaction per batch
- :mod:`.ledger`: the batch ledger (versioned JSON records in a topic)
- :mod:`.replay`: exactly-once replay of parked batches
- :mod:`.reliable_producer`, :mod:`.outbox`: publisher confirms and a durable outbox
- :mod:`.dedup`: a deduplicating receiver for side effects outside Pulsar
"""
