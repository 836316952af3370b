"""``pulsar-txn``: the command-line interface.

    pulsar-txn broker start|stop|status   run the local Pulsar standalone broker
    pulsar-txn demo                       end-to-end transactional example
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import localbroker


def _broker(args: argparse.Namespace) -> localbroker.LocalBroker:
    return localbroker.LocalBroker(
        args.data_dir,
        broker_port=args.port,
        web_port=args.web_port,
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


def cmd_demo(args: argparse.Namespace) -> int:
    from .examples.demo import run_demo

    if args.service_url:
        service_url, admin_url = args.service_url, args.admin_url
    else:
        b = _broker(args)
        b.start(timeout=args.timeout)
        service_url, admin_url = b.service_url, b.admin_url
    return run_demo(service_url, admin_url)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pulsar-txn", description="Exactly-once processing on Apache Pulsar")
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
    b.set_defaults(func=cmd_broker)

    d = sub.add_parser("demo", help="start the local broker and run the end-to-end transactional example")
    d.add_argument("--service-url", default=None, help="use this broker instead of starting the local one")
    d.add_argument("--admin-url", default=None, help="admin REST URL of --service-url's broker")
    broker_opts(d)
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "service_url", None) and not getattr(args, "admin_url", None):
        print("--admin-url is required with --service-url", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except localbroker.BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
