"""``txn.asyncio``: ``from txn.asyncio import Client`` for ``from pulsar.asyncio import Client``.

The names of the official ``pulsar.asyncio`` module; they live in :mod:`txn.asyncio_compat`.
(Modules of ``txn`` get the standard library's ``asyncio`` with ``import asyncio``: imports are
absolute; nothing in ``txn`` imports this module relatively.)
"""

from . import asyncio_compat as _compat
from .asyncio_compat import *  # noqa: F403 - the official module's names (asyncio_compat.__all__)

__all__ = list(_compat.__all__)
