"""``Client(logger=...)``: hand the client's log records to a ``logging.Logger`` of the caller's.

The official client sends its C++ core's log lines to the logger given, at that logger's level.
Here every module logs to a ``txn.*`` logger; while a client with ``logger=`` is open, the ``txn``
logger logs at the lowest level any such logger wants, hands each record to those loggers, and
passes on to its ancestors' handlers only what it would have passed before (the level it had), so
nothing else sees more ``txn`` records than without ``logger=``.
"""

from __future__ import annotations

import logging
import threading

_ROOT = "txn"
_lock = threading.Lock()


class _Forwarder(logging.Handler):
    """On the ``txn`` logger (which stops propagating meanwhile): the records to the clients'
    loggers at their levels, and to the ancestors' handlers as propagation would have."""

    def __init__(self, level: int, propagate: bool) -> None:
        super().__init__(logging.NOTSET)
        self.saved_level = level  # the txn logger's own level before (maybe NOTSET)
        self.saved_propagate = propagate
        self.targets: dict[int, logging.Logger] = {}

    def base_level(self) -> int:
        """The level below which records did not get out before any ``logger=`` was given."""
        if self.saved_level != logging.NOTSET:
            return self.saved_level
        parent = logging.getLogger(_ROOT).parent
        return parent.getEffectiveLevel() if parent is not None else logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        for target in list(self.targets.values()):
            if target.isEnabledFor(record.levelno):
                target.handle(record)
        if not self.saved_propagate or record.levelno < self.base_level():
            return
        node = logging.getLogger(_ROOT).parent
        while node is not None:
            for handler in node.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            if not node.propagate:
                break
            node = node.parent


_forwarder: _Forwarder | None = None


def check_logger(logger: object) -> None:
    """``logger`` must be None or a ``logging.Logger`` (the official client's ``ValueError`` otherwise)."""
    if logger is not None and not isinstance(logger, logging.Logger):
        raise ValueError("Logger is expected to be either None, logger.Logger, pulsar.ConsoleLogger or "
                         "pulsar.FileLogger")


def attach(key: int, logger: logging.Logger) -> None:
    """Send ``txn`` records to ``logger`` (at its level) until :func:`detach` with the same ``key``."""
    global _forwarder
    if logger.name == _ROOT or logger.name.startswith(_ROOT + "."):
        return  # it gets them already
    root = logging.getLogger(_ROOT)
    with _lock:
        if _forwarder is None:
            _forwarder = _Forwarder(root.level, root.propagate)
            root.addHandler(_forwarder)
            root.propagate = False
        _forwarder.targets[key] = logger
        _set_level(root, _forwarder)


def detach(key: int) -> None:
    """Stop sending records to the logger attached under ``key``; the last one restores ``txn``."""
    global _forwarder
    root = logging.getLogger(_ROOT)
    with _lock:
        if _forwarder is None or _forwarder.targets.pop(key, None) is None:
            return
        if _forwarder.targets:
            _set_level(root, _forwarder)
            return
        root.removeHandler(_forwarder)
        root.setLevel(_forwarder.saved_level)
        root.propagate = _forwarder.saved_propagate
        _forwarder = None


def _set_level(root: logging.Logger, fwd: _Forwarder) -> None:
    wanted = min(t.getEffectiveLevel() for t in fwd.targets.values())
    root.setLevel(min(wanted, fwd.base_level()))
