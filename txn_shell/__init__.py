"""txn_shell: the application built on the library.

The ``pulsar-txn`` command line (``cli``, ``cli_api``), the demo and its example handlers
(``examples``), the local Pulsar broker launcher (``localbroker``, the broker version in
``pulsar_version``) and the Spark standalone cluster launcher (``spark_cluster``). It sits above
``txn``, ``spark_jobs`` and ``coordinator_api``; none of them imports it.
"""
