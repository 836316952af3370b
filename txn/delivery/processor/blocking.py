"""``Processor``: the blocking facade over :class:`~.async_processor.AsyncProcessor`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ...bridge import run_blocking
from ...client import AsyncClient
from ...message import Message
from .async_processor import AsyncProcessor
from .config import ProcessorConfig, ProcessorStats


class Processor:
    """Blocking facade: ``Processor(service_url, inputs, output, subscription, handler, ...).run()``.

    ``run()`` processes until SIGTERM/SIGINT (or :meth:`stop`), then finishes the batch in
    flight and returns the stats.
    """

    def __init__(
        self,
        service_url: str,
        inputs: list[str] | str,
        output: str,
        subscription: str,
        handler: Callable[[Message], Any],
        *,
        job: str = "job",
        batch_max_messages: int = 100,
        batch_max_delay_ms: int = 100,
        progress: TextIO | None = sys.stderr,
        client_kwargs: dict[str, Any] | None = None,
        **config: Any,
    ) -> None:
        self.service_url = service_url
        self.client_kwargs = client_kwargs or {}
        self.config = ProcessorConfig(
            inputs=[inputs] if isinstance(inputs, str) else list(inputs),
            output=output,
            subscription=subscription,
            job=job,
            batch_max_messages=batch_max_messages,
            batch_max_delay_ms=batch_max_delay_ms,
            **config,
        )
        self.handler = handler
        self.progress = progress
        self._inner: AsyncProcessor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        """Ask the processor to stop after the batch in flight (thread-safe)."""
        if self._loop is not None and self._inner is not None:
            self._loop.call_soon_threadsafe(self._inner.stop)

    def run(self, max_batches: int | None = None, idle_exit_ms: int | None = None,
            install_signal_handlers: bool = True) -> ProcessorStats:
        """Run until stopped; returns the final stats."""
        return run_blocking(self._main(max_batches, idle_exit_ms, install_signal_handlers), "Processor.run()")

    async def _main(self, max_batches: int | None, idle_exit_ms: int | None, signals: bool) -> ProcessorStats:
        self._loop = asyncio.get_running_loop()
        async with AsyncClient(self.service_url, **self.client_kwargs) as client:
            proc = AsyncProcessor(client, self.handler, self.config, self.progress)
            self._inner = proc
            if signals and os.name == "posix":
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.add_signal_handler(sig, proc.stop)
                # SIGUSR1: print where every task of the processor waits (for a process that seems stuck).
                self._loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
            await proc.start()
            try:
                return await proc.run(max_batches=max_batches, idle_exit_ms=idle_exit_ms)
            finally:
                await proc.close()


def _dump_tasks() -> None:
    """Print every asyncio task's stack to stderr."""
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio tasks (SIGUSR1) ---", file=sys.stderr, flush=True)
    for t in tasks:
        t.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()
