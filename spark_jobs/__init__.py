"""Spark as the exactly-once function runtime: Pulsar source, transactional sink, micro-batch runtime.

Not built yet: see the Spark issue. The ``spark`` extra pins pyspark.
"""
