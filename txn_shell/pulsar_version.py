"""The Apache Pulsar release the project runs and tests against, pinned here and only here.

``deploy/bootstrap.sh`` and the local broker fetch this version; shell:
``python -c 'from txn_shell.pulsar_version import PULSAR_VERSION; print(PULSAR_VERSION)'``.
"""

PULSAR_VERSION = "4.0.8"
