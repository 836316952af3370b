"""``Client(logger=...)``: hand the client's log records to a ``logging.Logger`` of the caller's.

The official client sends its C++ core's log lines to the logger given, at that logger's level.
Here every module logs to a ``txn.*`` logger; while a client with ``logger=`` is open, the ``txn``
logger logs at the lowest level any such logger wants, hands each record to those loggers, and
passes on to its ancestors' handlers only what it would have passed before (the level it had), so
nothing else sees more ``txn`` records than without ``logger=``.

``ConsoleLogger`` and ``FileLogger`` (with ``LoggerLevel``) are the official client's other two
``logger=`` values: records at or above the level go to standard output, or are appended to a
file, which is closed when the client closes.
"""

from __future__ import annotations

import logging
import sys
import threading
from enum import IntEnum

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


class LoggerLevel(IntEnum):
    """The level of a :class:`ConsoleLogger` or :class:`FileLogger` (names and values as
    ``pulsar.LoggerLevel``)."""

    Debug = 0
    Info = 1
    Warn = 2
    Error = 3


_LEVELS = {LoggerLevel.Debug: logging.DEBUG, LoggerLevel.Info: logging.INFO, LoggerLevel.Warn: logging.WARNING,
           LoggerLevel.Error: logging.ERROR}
_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s [%(threadName)s] %(name)s | %(message)s"


def _check_level(log_level: object) -> LoggerLevel:
    if not isinstance(log_level, LoggerLevel):
        raise ValueError(f"Argument log_level is expected to be of type 'LoggerLevel' and not "
                         f"'{type(log_level).__name__}'")
    return log_level


class ConsoleLogger:
    """``Client(logger=ConsoleLogger(level))``: the client's records at ``log_level`` and above
    go to standard output (as ``pulsar.ConsoleLogger``)."""

    def __init__(self, log_level: LoggerLevel = LoggerLevel.Info) -> None:
        self.log_level = _check_level(log_level)

    def _make(self) -> logging.Logger:
        return _owned_logger("txn-console", logging.StreamHandler(sys.stdout), self.log_level)


class FileLogger:
    """``Client(logger=FileLogger(level, path))``: the client's records at ``log_level`` and
    above are appended to ``log_file`` (as ``pulsar.FileLogger``)."""

    def __init__(self, log_level: LoggerLevel, log_file: str) -> None:
        self.log_level = _check_level(log_level)
        if not isinstance(log_file, str):
            raise ValueError(f"Argument log_file is expected to be of type 'str' and not '{type(log_file).__name__}'")
        self.log_file = log_file

    def _make(self) -> logging.Logger:
        return _owned_logger("txn-file", logging.FileHandler(self.log_file, encoding="utf-8"), self.log_level)


class _OwnedLogger(logging.Logger):
    """The logger of a :class:`ConsoleLogger` or :class:`FileLogger`: outside the logging tree
    (nothing propagates from it); :func:`detach` closes its handlers."""


def _owned_logger(name: str, handler: logging.Handler, level: LoggerLevel) -> logging.Logger:
    handler.setFormatter(logging.Formatter(_FORMAT, "%Y-%m-%d %H:%M:%S"))
    logger = _OwnedLogger(name, _LEVELS[level])
    logger.addHandler(handler)
    logger.propagate = False
    return logger


def check_logger(logger: object) -> None:
    """``logger`` must be None, a ``logging.Logger``, a :class:`ConsoleLogger` or a
    :class:`FileLogger` (the official client's ``ValueError`` otherwise)."""
    if logger is not None and not isinstance(logger, (logging.Logger, ConsoleLogger, FileLogger)):
        raise ValueError("Logger is expected to be either None, logger.Logger, pulsar.ConsoleLogger or "
                         "pulsar.FileLogger")


def as_logger(logger: logging.Logger | ConsoleLogger | FileLogger) -> logging.Logger:
    """The ``logging.Logger`` that :func:`attach` takes for a ``logger=`` value."""
    return logger._make() if isinstance(logger, (ConsoleLogger, FileLogger)) else logger


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
        target = None if _forwarder is None else _forwarder.targets.pop(key, None)
        if isinstance(target, _OwnedLogger):
            for handler in list(target.handlers):
                target.removeHandler(handler)
                handler.close()
        if _forwarder is None or target is None:
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
