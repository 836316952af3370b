"""``pulsar-txn``: the command-line interface.

    pulsar-txn broker start|stop|status   run the local Pulsar standalone broker
    pulsar-txn cluster start|stop|status  run a local Pulsar cluster (ZooKeeper, 3 bookies, 3 brokers)
    pulsar-txn demo                       Spark exactly-once job, failure, poison, replay, proof
    pulsar-txn process ...                exactly-once consume -> transform -> produce
    pulsar-txn replay --batch ID ...      replay a parked batch exactly once
    pulsar-txn spark submit JOB ...       Spark exactly-once runtime (DataFrame transform per batch)
    pulsar-txn spark drop-subscription    drop a retired streaming query's subscription (pulsar source)
    pulsar-txn api | txns | batches | jobs   the control plane, and its client (see txn_shell/cli_api.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from txn.settings import BrokerSettings, SettingsError, add_broker_arguments
from txn.version import __version__

from . import cli_api, localbroker

if TYPE_CHECKING:
    from txn.delivery.processor.metrics import MetricsOptions


def _broker(args: argparse.Namespace) -> localbroker.LocalBroker:
    return localbroker.LocalBroker(
        args.data_dir,
        broker_port=args.port,
        web_port=args.web_port,
        bookie_port=getattr(args, "bookie_port", None),
        transaction_coordinators=args.coordinators,
    )


def cmd_broker(args: argparse.Namespace) -> int:
    b = _broker(args)
    if args.action == "start":
        started = b.start(timeout=args.timeout)
        if not started:
            print(f"broker already running (pid {b.pid})")
        print(f"service URL: {b.service_url}\nadmin URL:   {b.admin_url}\nlog:         {b.log_file}")
        return 0
    if args.action == "stop":
        if b.stop():
            print("broker stopped")
        else:
            print("broker was not running")
        return 0
    st = b.status()
    if args.json:
        print(json.dumps(st, indent=2, default=str))
    else:
        for k, v in st.items():
            print(f"{k:>24}: {v}")
    return 0 if st.get("running") and st.get("healthy") else 3


def cmd_cluster(args: argparse.Namespace) -> int:
    from . import localcluster

    c = localcluster.LocalCluster(args.data_dir, coordinators=args.coordinators)
    if args.action == "start":
        c.start(timeout=args.timeout)
        print(f"service URL: {c.service_url}\nadmin URL:   {c.admin_url}\nlogs:        {c.data_dir / 'logs'}")
        return 0
    if args.action == "stop":
        print("cluster stopped" if c.stop() else "cluster was not running")
        return 0
    st = c.status()
    if args.json:
        print(json.dumps(st, indent=2, default=str))
    else:
        for k, v in st.items():
            if k != "nodes":
                print(f"{k:>18}: {v}")
        for n in st["nodes"]:
            state = "serving" if n["serving"] else "running, not serving" if n["running"] else "down"
            ports = " ".join(f"{k}={v}" for k, v in n["ports"].items())
            print(f"{n['name']:>18}: {state:<20} pid={n['pid']} {ports}")
    return 0 if st["healthy"] else 3


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .examples import missing_demo_modules

    missing = missing_demo_modules()
    if missing:
        print(f"error: pulsar-txn demo needs the demo extra (pip install 'pulsar-txn[demo]'); "
              f"not installed: {', '.join(missing)}", file=sys.stderr)
        return 2
    from .examples.demo import DemoOptions, run_demo

    opts = DemoOptions(service_url=args.service_url, admin_url=args.admin_url,
                       work_dir=Path(args.work_dir) if args.work_dir else None, keep_running=args.keep_running,
                       json_path=Path(args.json) if args.json else None, api_port=args.api_port,
                       broker_timeout=args.timeout)
    return run_demo(opts, None if args.service_url else _broker(args))


def cmd_process(args: argparse.Namespace) -> int:
    import logging

    from txn.consumer import ConsumerType
    from txn.delivery.output import load_handler
    from txn.delivery.processor import Processor

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = load_handler(args.handler)
    schemas = _schemas(args)
    broker = BrokerSettings.from_args(args)
    extra = {}
    if args.ledger_topic:
        extra["ledger_topic"] = args.ledger_topic
    proc = Processor(
        broker.require_service_url(),
        args.input,
        args.output,
        args.subscription,
        handler,
        job=args.job or args.subscription,
        batch_max_messages=args.batch_max_messages,
        batch_max_bytes=args.batch_max_bytes,
        guard_checkpoint_s=args.guard_checkpoint_s,
        batch_max_delay_ms=args.batch_max_delay_ms,
        max_attempts=args.max_attempts,
        txn_timeout_ms=args.txn_timeout_ms,
        progress_interval_s=args.progress_interval,
        handler_spec=args.handler,
        receiver_queue_size=args.receiver_queue_size,
        max_inflight_commits=args.max_inflight_commits,
        ledger_guard=not args.no_ledger_guard,
        fencing=not args.no_fencing,
        consumer_type=ConsumerType.Shared if args.no_fencing else ConsumerType.Failover,
        claim_timeout_ms=args.claim_timeout_ms,
        start_timeout_ms=args.start_timeout_ms,
        guard_max_ids=args.guard_max_ids,
        batch_entry_boundaries=args.batch_entry_boundaries,
        client_kwargs=broker.client_kwargs(),
        metrics=_metrics_options(args),
        **schemas,
        **extra,
    )
    print(f"processing {', '.join(args.input)} -> {args.output} as job {proc.config.job!r} "
          f"(subscription {args.subscription!r}); SIGTERM or Ctrl-C stops after the batch in flight",
          file=sys.stderr, flush=True)
    stats = proc.run(idle_exit_ms=args.exit_when_idle_ms)
    print(f"stopped: {stats.batches} batches, {stats.messages} messages, {stats.aborts} aborts, "
          f"{stats.parked} parked, {stats.duplicates_skipped} already committed per the ledger (acked again, "
          "no output)", file=sys.stderr)
    return 0


def _schemas(args: argparse.Namespace) -> dict[str, Any]:
    """``--input-schema`` / ``--output-schema`` as the processor's (and a replay's) keywords."""
    from txn.delivery.output import load_schema

    out: dict[str, Any] = {}
    for flag, key in (("input_schema", "input_schema"), ("output_schema", "output_schema")):
        spec = getattr(args, flag, None)
        if spec:
            try:
                out[key] = load_schema(spec)
            except (ValueError, ImportError, AttributeError) as exc:
                raise SystemExit(f"error: --{flag.replace('_', '-')}: {exc}") from None
    return out


def _add_schema_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-schema", default=None, metavar="SPEC",
                   help="the inputs' schema, which message.value() decodes by: string, json:module:Record or "
                        "avro:module:Record (default: none, value() is the bytes)")
    p.add_argument("--output-schema", default=None, metavar="SPEC",
                   help="the outputs' schema, registered with the output topic and encoding values the handler "
                        "returns (same forms)")


def _metrics_options(args: argparse.Namespace) -> MetricsOptions | None:
    """``--metrics-port`` and friends as the processor's metrics options (None: no exporter)."""
    if args.metrics_port is None:
        return None
    from txn.delivery.processor.metrics import MetricsOptions, MetricsUnavailable, require_prometheus
    from txn.settings import BrokerSettings

    try:
        require_prometheus()  # fail now, naming the extra, if prometheus_client is missing
    except MetricsUnavailable as exc:
        raise SystemExit(f"error: {exc}") from None
    admin = BrokerSettings.from_args(args).with_urls(admin_url=args.metrics_admin_url)
    kw = admin.admin_kwargs() if admin.admin_url else {}
    return MetricsOptions(args.metrics_port, args.metrics_host, admin_url=admin.admin_url,
                          admin_token=kw.get("token"), admin_context=kw.get("context"))


def cmd_replay(args: argparse.Namespace) -> int:
    from txn.delivery.ledger import default_ledger_topic
    from txn.delivery.output import load_handler
    from txn.delivery.replay import ReplayError, replay

    ledger = args.ledger_topic or default_ledger_topic(args.output or "persistent://public/default/x")
    handler = load_handler(args.handler) if args.handler else None
    replayer = None
    if args.transform:
        from spark_jobs.runtime import replay_outputs as replayer
    broker = BrokerSettings.from_args(args)
    try:
        res = replay(broker.require_service_url(), args.batch, ledger, handler=handler, output=args.output,
                     transform=args.transform, replayer=replayer, **_schemas(args), **broker.client_kwargs())
    except ReplayError as exc:
        print(f"cannot replay: {exc}", file=sys.stderr)
        return 1
    print(res.message)
    if res.replayed:
        for topic, n in sorted(res.outputs.items()):
            print(f"  {n} output(s) -> {topic}")
    return 0


def cmd_spark_submit(args: argparse.Namespace) -> int:
    import logging
    import os

    from pyspark.sql import SparkSession

    from spark_jobs import register
    from spark_jobs.jobs import JOBS
    from spark_jobs.runtime import run_job

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Python workers must run this interpreter (the one with txn, pyarrow and the job's code).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spec = JOBS.get(args.job_spec, args.job_spec)
    broker = BrokerSettings.from_args(args)
    broker.require_service_url()  # before Spark starts
    spark = (SparkSession.builder.master(args.master).appName(f"pulsar-txn {args.job or args.job_spec}")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    try:
        register(spark)
    except ImportError:
        pass  # the source/sink are optional for the runtime
    print(f"spark {spark.version} on {args.master}: job {spec} {', '.join(args.input)} -> {args.output}",
          file=sys.stderr, flush=True)
    try:
        stats = run_job(spark, None, args.input, args.output, args.subscription, spec, settings=broker,
                        job=args.job or args.job_spec, batch_max_messages=args.batch_max_messages,
                        batch_max_delay_ms=args.batch_max_delay_ms, max_batches=args.max_batches,
                        idle_exit_ms=args.exit_when_idle_ms, max_attempts=args.max_attempts,
                        txn_timeout_ms=args.txn_timeout_ms, progress_interval_s=args.progress_interval,
                        mode=args.mode, metrics=_metrics_options(args),
                        **({} if args.batch_max_bytes is None else {"batch_max_bytes": args.batch_max_bytes}))
    finally:
        spark.stop()
    print(f"stopped: {stats.batches} batches, {stats.messages} messages, {stats.outputs} outputs, "
          f"{stats.aborts} aborts, {stats.parked} parked", file=sys.stderr)
    return 0


def cmd_spark_drop_subscription(args: argparse.Namespace) -> int:
    from spark_jobs.subscription import DropError, checkpoint_subscriptions, drop_subscription

    if args.checkpoint:
        try:
            held = checkpoint_subscriptions(args.checkpoint)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.subscription:
            held = {k: v for k, v in held.items() if k == args.subscription}
        if not held:
            print(f"error: the checkpoint {args.checkpoint} names no pulsar source subscription"
                  + (f" {args.subscription!r}" if args.subscription else ""), file=sys.stderr)
            return 2
    elif args.topic and args.subscription:
        held = {args.subscription: args.topic}
    else:
        print("error: give --checkpoint, or --topic and --subscription", file=sys.stderr)
        return 2
    broker = BrokerSettings.from_args(args)
    for name, topics in held.items():
        for topic in topics:
            try:
                dropped = drop_subscription(broker.require_admin_url(), topic, name, **broker.admin_kwargs())
            except (DropError, OSError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(f"{'dropped' if dropped else 'no'} subscription {name} on {topic}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pulsar-txn", description="Exactly-once processing on Apache Pulsar")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def broker_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--data-dir", default=None, help="broker state (default: ~/.cache/pulsar-txn/standalone-data)")
        sp.add_argument("--port", type=int, default=None, help="binary protocol port (default 6650)")
        sp.add_argument("--web-port", type=int, default=None, help="admin REST port (default 8080)")
        sp.add_argument("--coordinators", type=int, default=None, help="transaction coordinators (default 1)")
        sp.add_argument("--timeout", type=float, default=240, help="seconds to wait for the broker to be ready")

    b = sub.add_parser("broker", help="start, stop or inspect the local Pulsar standalone broker")
    b.add_argument("action", choices=["start", "stop", "status"])
    b.add_argument("--json", action="store_true", help="status as JSON")
    broker_opts(b)
    b.add_argument("--bookie-port", type=int, default=None,
                   help="the embedded bookie's port (default 3181, or a free one when 3181 is taken)")
    b.set_defaults(func=cmd_broker)

    c = sub.add_parser("cluster", help="start, stop or inspect a local Pulsar cluster: ZooKeeper, 3 bookies, "
                       "3 brokers, transactions on, 4 coordinators")
    c.add_argument("action", choices=["start", "stop", "status"])
    c.add_argument("--data-dir", default=None, help="cluster state (default: ~/.cache/pulsar-txn/cluster-data)")
    c.add_argument("--coordinators", type=int, default=4, help="transaction coordinators of a new cluster")
    c.add_argument("--timeout", type=float, default=300, help="seconds to wait for the cluster to be ready")
    c.add_argument("--json", action="store_true", help="status as JSON")
    c.set_defaults(func=cmd_cluster)

    d = sub.add_parser("demo", help="the local broker, the control plane and a Spark exactly-once job: a failure, "
                       "a poison message parked and replayed over REST, and the exactly-once check")
    d.add_argument("--service-url", default=None, help="use this broker instead of starting the local one")
    d.add_argument("--admin-url", default=None, help="admin REST URL of --service-url's broker")
    d.add_argument("--keep-running", action="store_true", help="leave the control plane (and broker) running")
    d.add_argument("--work-dir", default=None, help="logs, SQLite database, flags (default: ~/.cache/pulsar-txn/demo)")
    d.add_argument("--api-port", type=int, default=None, help="control plane port (default 8765, else a free one)")
    d.add_argument("--json", default=None, metavar="FILE", help="also write the summary to FILE as JSON")
    broker_opts(d)
    d.set_defaults(func=cmd_demo)

    pr = sub.add_parser("process", help="exactly-once consume -> transform -> produce, one transaction per batch")
    add_broker_arguments(pr, service_url_required=True, admin_url=False)
    pr.add_argument("--input", action="append", required=True, help="input topic (repeat for several)")
    pr.add_argument("--output", required=True, help="default output topic")
    pr.add_argument("--subscription", required=True)
    pr.add_argument("--handler", required=True, help="module:function, called with each message")
    pr.add_argument("--job", default=None, help="job name in the ledger (default: the subscription)")
    _add_schema_arguments(pr)
    pr.add_argument("--batch-max-messages", type=int, default=100)
    pr.add_argument("--batch-max-bytes", type=int, default=8 * 1024 * 1024,
                    help="a batch closes before its inputs' payloads pass this many bytes; a larger input goes "
                         "alone (default 8 MiB; 0: no bound)")
    pr.add_argument("--guard-checkpoint-s", type=float, default=30.0,
                    help="seconds between the ledger guard's checkpoints, which let a restart read only the "
                         "ledger's tail (default 30; 0: none, every start reads the whole ledger)")
    pr.add_argument("--batch-max-delay-ms", type=int, default=100)
    pr.add_argument("--max-attempts", type=int, default=3, help="aborts before a batch is narrowed / parked")
    pr.add_argument("--txn-timeout-ms", type=int, default=60000)
    pr.add_argument("--receiver-queue-size", type=int, default=1000, help="consumer prefetch (bounded)")
    pr.add_argument("--max-inflight-commits", type=int, default=2, help="batches committing in the background")
    pr.add_argument("--ledger-topic", default=None, help="default: pulsar-txn-ledger in the output's namespace")
    pr.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")
    pr.add_argument("--exit-when-idle-ms", type=int, default=None, help="exit after this long without input")
    pr.add_argument("--batch-entry-boundaries", action="store_true",
                    help="never split a batch entry of the input between two transactions (a batch may then "
                         "exceed --batch-max-messages by up to one entry)")
    pr.add_argument("--no-ledger-guard", action="store_true",
                    help="trust the broker's ack state alone (not recommended: Pulsar 4.0.x can lose batch acks)")
    pr.add_argument("--no-fencing", action="store_true",
                    help="no partition fences, a Shared subscription (only for one instance that never runs twice: "
                         "two live instances can then commit an input twice)")
    pr.add_argument("--claim-timeout-ms", type=int, default=None,
                    help="bound on taking an input partition over from another instance (default: 2 x the "
                         "transaction timeout + 60 s)")
    pr.add_argument("--start-timeout-ms", type=int, default=120_000,
                    help="how long start-up retries while the broker is unreachable or not ready (default 120000; "
                         "0: one attempt)")
    pr.add_argument("--guard-max-ids", type=int, default=1_000_000,
                    help="committed input ids the ledger guard remembers (bounded state, ~60 bytes each)")
    pr.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus metrics on this port (0: a free one; needs the metrics extra); default off")
    pr.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics port binds (default 0.0.0.0)")
    pr.add_argument("--metrics-admin-url", default=None,
                    help="admin REST URL to read the subscription's backlog from (default: PULSAR_TXN_ADMIN_URL; "
                         "none: no backlog metric)")
    pr.set_defaults(func=cmd_process)

    rp = sub.add_parser("replay", help="replay a parked batch exactly once")
    add_broker_arguments(rp, service_url_required=True, admin_url=False)
    rp.add_argument("--batch", required=True, help="batch id (from the ledger / the PARKED record)")
    rp.add_argument("--ledger-topic", default=None, help="default: pulsar-txn-ledger in --output's namespace")
    code = rp.add_mutually_exclusive_group(required=True)  # never taken from the ledger
    code.add_argument("--handler", default=None, help="module:function called per parked message")
    code.add_argument("--transform", default=None, help="module:function, a Spark DataFrame transform")
    rp.add_argument("--output", required=True, help="output topic (of outputs that name none)")
    _add_schema_arguments(rp)
    rp.set_defaults(func=cmd_replay)

    sp = sub.add_parser("spark", help="Spark exactly-once runtime")
    ssub = sp.add_subparsers(dest="spark_command", required=True)
    sm = ssub.add_parser("submit", help="run a DataFrame -> DataFrame job, one transaction per micro-batch")
    sm.add_argument("job_spec", metavar="JOB", help="module:function, or an example: enrich, windowed_counts")
    # --admin-url: checks broker deduplication on the output, which makes a retried Spark write task
    # exact (without it a retried write task fails the batch, which runs again).
    add_broker_arguments(sm, service_url_required=True, admin_url=True)
    sm.add_argument("--input", action="append", required=True)
    sm.add_argument("--output", required=True)
    sm.add_argument("--subscription", required=True)
    sm.add_argument("--job", default=None, help="job name in the ledger (default: JOB)")
    sm.add_argument("--master", default="local[*]", help="Spark master (local[*], spark://host:7077, ...)")
    sm.add_argument("--batch-max-messages", type=int, default=10000)
    sm.add_argument("--batch-max-delay-ms", type=int, default=1000)
    sm.add_argument("--batch-max-bytes", type=int, default=None,
                    help="a batch also closes before its inputs' payloads pass this many bytes (default: 64 MiB "
                         "distributed, 8 MiB with --mode driver; 0: no bound by bytes)")
    sm.add_argument("--max-attempts", type=int, default=3)
    sm.add_argument("--txn-timeout-ms", type=int, default=120000)
    sm.add_argument("--shuffle-partitions", type=int, default=4)
    sm.add_argument("--max-batches", type=int, default=None)
    sm.add_argument("--exit-when-idle-ms", type=int, default=None)
    sm.add_argument("--progress-interval", type=float, default=5.0)
    sm.add_argument("--mode", choices=("distributed", "driver"), default="distributed",
                    help="distributed: executors read, transform and write (default); driver: all in the driver "
                    "(faster for batches of a few thousand messages)")
    sm.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus metrics on this port (0: a free one; needs the metrics extra); default off")
    sm.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics port binds (default 0.0.0.0)")
    sm.add_argument("--metrics-admin-url", default=None,
                    help="admin REST URL to read the subscription's backlog from (default: --admin-url / "
                         "PULSAR_TXN_ADMIN_URL; none: no backlog metric)")
    sm.set_defaults(func=cmd_spark_submit)
    sd = ssub.add_parser("drop-subscription", help="drop the durable subscription a retired streaming query of the "
                         "pulsar source holds (stop the query first)")
    sd.add_argument("--checkpoint", default=None, help="the query's (local) checkpoint: its subscription, partitions")
    sd.add_argument("--topic", action="append", default=None, help="topic or partition (repeat for several)")
    sd.add_argument("--subscription", default=None, help="the subscription (option subscription of the query)")
    add_broker_arguments(sd, admin_url=True)
    sd.set_defaults(func=cmd_spark_drop_subscription)

    cli_api.register(sub)  # imports coordinator_api only when `api` runs
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo" and args.service_url and not args.admin_url:
        print("--admin-url is required with --service-url", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except localbroker.BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
