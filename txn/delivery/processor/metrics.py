"""Prometheus metrics of a running processor (``pulsar-txn process``) or Spark runtime driver.

Every series is named ``pulsartxn_processor_*`` (never ``pulsar_txn_*``, the broker's own
transaction series) and labelled with the ``pipeline`` (the job's name; the label was called
``job`` before, a name Prometheus reserves for its scrape job) and the ``runtime`` (``processor``
or ``spark``). Running totals are counters ending ``_total``:

==========================================================  =========  ==========================================
series                                                      type       what
==========================================================  =========  ==========================================
``pulsartxn_processor_batches_committed_total``             counter    batches committed
``pulsartxn_processor_batch_aborts_total``                  counter    batch attempts aborted
``pulsartxn_processor_messages_committed_total``            counter    inputs committed (acked with outputs)
``pulsartxn_processor_outputs_total``                       counter    outputs committed
``pulsartxn_processor_parked_total``                        counter    inputs parked (poison or unreadable)
``pulsartxn_processor_duplicates_skipped_total``            counter    inputs the ledger guard found committed
``pulsartxn_processor_inflight_commits``                    gauge      batches committing in the background
``pulsartxn_processor_commit_latency_seconds``              histogram  transaction open to commit, per batch
``pulsartxn_processor_last_commit_timestamp_seconds``       gauge      Unix time of the last commit
``pulsartxn_processor_seconds_since_last_commit``           gauge      since the last commit (or the start)
``pulsartxn_processor_backlog_messages``                    gauge      the subscription's backlog per input topic
``pulsartxn_processor_backlog_errors_total``                counter    failed admin-API backlog reads
==========================================================  =========  ==========================================

The counters are read from the processor's :class:`~.config.ProcessorStats` at scrape time; the
histogram is fed by :meth:`ProcessorMetrics.observe_commit`, which the commit pipeline calls.
The backlog comes from the broker's admin REST API (topic stats), only when an admin URL is
given, cached for ``ttl_s`` and for at most ``max_topics`` topics, so a scrape costs at most one
round of admin calls per TTL.

``prometheus_client`` is needed only when metrics are served (the ``metrics`` extra); without
it :meth:`ProcessorMetrics.serve` raises :class:`MetricsUnavailable` naming the extra.

The metrics port also answers ``GET /livez`` (``{"status": "alive"}``, nothing collected, no
broker call): the pod probe of a processor and of a Spark runtime driver (``deploy/k8s``). It says
the process runs and serves the port; a stalled batch loop shows in
``pulsartxn_processor_seconds_since_last_commit`` and the backlog instead.

``AsyncProcessor.start`` serves them when ``ProcessorConfig.metrics`` holds a
:class:`MetricsOptions` (``pulsar-txn process --metrics-port``), and ``close`` stops serving. A
runtime built on ``AsyncProcessor`` (the Spark runtime) passes ``MetricsOptions(port,
runtime="spark")`` in its config; one that is not calls :meth:`ProcessorMetrics.observe_commit`
per commit itself::

    metrics = ProcessorMetrics(job, lambda: stats, lambda: inflight, runtime="spark")
    metrics.serve(9464)             # http://host:9464/metrics
    metrics.observe_commit(commit_ms)
    metrics.close()
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...admin import admin_request, topic_path
from ...topic import parse_topic

PREFIX = "pulsartxn_processor"
#: Commit-latency histogram bounds in seconds (ascending).
COMMIT_LATENCY_BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Every series this module exports (the dashboard test checks its queries against these).
METRIC_NAMES = tuple(f"{PREFIX}_{n}" for n in (
    "batches_committed_total", "batch_aborts_total", "messages_committed_total", "outputs_total", "parked_total",
    "duplicates_skipped_total", "inflight_commits", "commit_latency_seconds", "last_commit_timestamp_seconds",
    "seconds_since_last_commit", "backlog_messages", "backlog_errors_total"))


@dataclass(slots=True)
class MetricsOptions:
    """Serve a processor's metrics on ``host:port`` (port 0: a free one); with ``admin_url`` (and its
    ``admin_token`` / ``admin_context``) also the backlog of its subscription, read every ``backlog_ttl_s``."""

    port: int
    host: str = "0.0.0.0"
    admin_url: str | None = None
    admin_token: str | None = None
    admin_context: ssl.SSLContext | None = None
    backlog_ttl_s: float = 15.0
    runtime: str = "processor"


class MetricsUnavailable(RuntimeError):
    """Metrics were asked for but ``prometheus_client`` is not installed."""


def require_prometheus() -> Any:
    """The ``prometheus_client`` module, or :class:`MetricsUnavailable` naming the extra that installs it."""
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable("serving Prometheus metrics (--metrics-port / metrics_port) needs prometheus_client: "
                                 "pip install 'pulsar-txn[metrics]'") from None
    return prometheus_client


class BacklogProbe:
    """The backlog (``msgBacklog``) of ``subscription`` on each topic, from the admin API's topic
    stats; a partitioned topic's is the sum over its partitions (``partitioned-stats``).

    Results are cached for ``ttl_s``; a failed read keeps the last values and counts an error."""

    def __init__(self, admin_url: str, subscription: str, topics: list[str], *, token: str | None = None,
                 context: ssl.SSLContext | None = None, ttl_s: float = 15.0, timeout_s: float = 5.0,
                 max_topics: int = 64) -> None:
        self.admin_url = admin_url
        self.subscription = subscription
        self.topics = [str(parse_topic(t)) for t in topics[:max_topics]]
        self.token = token
        self.context = context
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.errors = 0
        self._values: dict[str, int] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def _one(self, topic: str) -> int | None:
        base = "/admin/v2/" + topic_path(topic)
        status, body = admin_request("GET", self.admin_url, base + "/stats", timeout=self.timeout_s,
                                     token=self.token, context=self.context)
        if status == 404:  # a partitioned topic's name: its partitions' sum
            status, body = admin_request("GET", self.admin_url, base + "/partitioned-stats", timeout=self.timeout_s,
                                         token=self.token, context=self.context)
        if status == 404:  # no such topic (yet): no backlog to report
            return None
        if status != 200 or not isinstance(body, dict):
            raise OSError(f"topic stats of {topic}: HTTP {status}")
        sub = (body.get("subscriptions") or {}).get(self.subscription)
        if sub is None:
            return None
        return int(sub.get("msgBacklog") or 0)

    def backlog(self) -> dict[str, int]:
        """Topic -> backlog of the subscription (topics where it does not exist are left out)."""
        with self._lock:
            if time.monotonic() - self._read_at < self.ttl_s:
                return dict(self._values)
            values: dict[str, int] = {}
            try:
                for t in self.topics:
                    n = self._one(t)
                    if n is not None:
                        values[t] = n
                self._values = values
            except OSError:
                self.errors += 1
            self._read_at = time.monotonic()
            return dict(self._values)


class ProcessorMetrics:
    """The Prometheus collector of one processor (see the module docs for the series)."""

    # ``stats`` returns the processor's :class:`~.config.ProcessorStats` (not imported: config imports this module).
    def __init__(self, job: str, stats: Callable[[], Any], inflight: Callable[[], int] = lambda: 0,
                 backlog: BacklogProbe | None = None, runtime: str = "processor") -> None:
        self.job = job
        self.runtime = runtime
        self._stats = stats
        self._inflight = inflight
        self.backlog = backlog
        self._buckets = [0] * (len(COMMIT_LATENCY_BOUNDS_S) + 1)
        self._count = 0
        self._sum_s = 0.0
        self._last_commit: float | None = None
        self._started = time.time()
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_processor(cls, proc: Any, options: MetricsOptions) -> ProcessorMetrics:
        """Metrics of an :class:`~.async_processor.AsyncProcessor` (or subclass): its job, stats,
        commits in flight, and (with ``options.admin_url``) its subscription's backlog on its inputs."""
        probe = None
        if options.admin_url:
            probe = BacklogProbe(options.admin_url, proc.config.subscription, list(proc.inputs),
                                 token=options.admin_token, context=options.admin_context, ttl_s=options.backlog_ttl_s)
        return cls(proc.config.job, lambda: proc.stats, lambda: proc.inflight_commits, probe, options.runtime)

    def observe_commit(self, commit_ms: float) -> None:
        """Record one committed batch's open-to-commit time (called by the commit pipeline)."""
        s = commit_ms / 1000
        i = next((k for k, b in enumerate(COMMIT_LATENCY_BOUNDS_S) if s <= b), len(COMMIT_LATENCY_BOUNDS_S))
        with self._lock:
            self._buckets[i] += 1
            self._count += 1
            self._sum_s += s
            self._last_commit = time.time()

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (prometheus_client's collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        labels = ["pipeline", "runtime"]
        key = [self.job, self.runtime]
        st = self._stats()
        for name, doc, value in (
            ("batches_committed", "Batches committed", st.batches),
            ("batch_aborts", "Batch attempts aborted", st.aborts),
            ("messages_committed", "Inputs committed (acknowledged in the batch's transaction)", st.messages),
            ("outputs", "Outputs committed", st.outputs),
            ("parked", "Inputs parked (poison or unreadable)", st.parked),
            ("duplicates_skipped", "Inputs the ledger guard found already committed (acked again, no output)",
             st.duplicates_skipped),
        ):
            c = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
            c.add_metric(key, value)
            yield c
        g = GaugeMetricFamily(f"{PREFIX}_inflight_commits", "Batches committing in the background", labels=labels)
        g.add_metric(key, self._inflight())
        yield g
        with self._lock:
            buckets, count, total, last = list(self._buckets), self._count, self._sum_s, self._last_commit
        h = HistogramMetricFamily(f"{PREFIX}_commit_latency_seconds", "Transaction open to commit, per batch",
                                  labels=labels)
        cum, acc = [], 0
        for b, k in zip(COMMIT_LATENCY_BOUNDS_S, buckets, strict=False):
            acc += k
            cum.append((repr(b), acc))
        h.add_metric(key, [*cum, ("+Inf", count)], total)
        yield h
        if last is not None:
            g = GaugeMetricFamily(f"{PREFIX}_last_commit_timestamp_seconds", "Unix time of the last commit",
                                  labels=labels)
            g.add_metric(key, last)
            yield g
        g = GaugeMetricFamily(f"{PREFIX}_seconds_since_last_commit",
                              "Seconds since the last commit (since the start before the first)", labels=labels)
        g.add_metric(key, max(0.0, time.time() - (last if last is not None else self._started)))
        yield g
        if self.backlog is not None:
            values = self.backlog.backlog()
            g = GaugeMetricFamily(f"{PREFIX}_backlog_messages", "Backlog of the job's subscription per input topic",
                                  labels=[*labels, "topic", "subscription"])
            for topic, n in sorted(values.items()):
                g.add_metric([*key, topic, self.backlog.subscription], n)
            yield g
            c = CounterMetricFamily(f"{PREFIX}_backlog_errors", "Failed admin-API reads of the backlog",
                                    labels=labels)
            c.add_metric(key, self.backlog.errors)
            yield c

    def render(self) -> bytes:
        """The Prometheus text exposition of these metrics."""
        prom = require_prometheus()
        reg = prom.CollectorRegistry(auto_describe=False)
        reg.register(self)
        return prom.generate_latest(reg)

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` over HTTP on ``host:port`` (0: a free port) in a daemon thread; the port.

        The same server answers ``GET /livez`` with ``{"status": "alive"}`` without collecting
        anything (no admin call, however slow the broker): the probe of a processor's or a Spark
        driver's pod. It means the process runs and serves this port, nothing more."""
        prom = require_prometheus()
        reg = prom.CollectorRegistry(auto_describe=False)
        reg.register(self)
        self._server, self._thread = prom.start_http_server(port, addr=host, registry=reg)
        self._server.set_app(_with_livez(self._server.get_app()))
        return int(self._server.server_port)

    @property
    def url(self) -> str | None:
        """``http://host:port/metrics`` while serving."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


LIVEZ_BODY = b'{"status": "alive"}'


def _with_livez(metrics_app: Callable[..., Any]) -> Callable[..., Any]:
    """A WSGI app: ``GET /livez`` answers :data:`LIVEZ_BODY`, every other request goes to ``metrics_app``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == "/livez" and environ.get("REQUEST_METHOD") == "GET":
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(LIVEZ_BODY)))])
            return [LIVEZ_BODY]
        return metrics_app(environ, start_response)

    return app
