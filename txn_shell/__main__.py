"""``python -m txn_shell``: the ``pulsar-txn`` command line."""

import sys

from .cli import main

sys.exit(main())
