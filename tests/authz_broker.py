# ruff: noqa: SLF001 - the launcher's wire helpers, reused for an authenticated probe
"""A local broker with token authentication *and* authorization, for the Spark security tests.

``LocalBroker(security=True)`` lets clients without credentials in as role ``anonymous`` with
authorization off, so the anonymous role may do anything. :class:`AuthzBroker` turns
authorization on: role ``tester`` (the broker's token) is the super-user, the broker's own
clients authenticate with its token, and ``anonymous`` gets only what a namespace grants it, so a
client that forgets its credentials is refused. The launcher's readiness checks call the admin
API and the coordinators anonymously; here they carry the token.
"""

from __future__ import annotations

import functools
import socket
from pathlib import Path
from typing import Any

import txn_shell.localbroker as lb
from txn_shell.localbroker import TOKEN_ROLE, LocalBroker

__all__ = ["AuthzBroker"]


class AuthzBroker(LocalBroker):
    """:class:`LocalBroker` with ``security=True`` and authorization enabled (see the module docs)."""

    def __init__(self, data_dir: str | Path, **kw: Any) -> None:
        super().__init__(data_dir, security=True, **kw)

    def _write_config(self, home: Path) -> None:
        super()._write_config(home)
        token = self.token
        assert token, "security material is written by LocalBroker._write_config"
        extra = {
            "authorizationEnabled": "true",
            "superUserRoles": TOKEN_ROLE,
            "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "brokerClientAuthenticationParameters": f"token:{token}",
        }
        with self.conf_file.open("a", encoding="utf-8") as f:  # later keys win when the file is loaded
            f.write("\n" + "".join(f"{k}={v}\n" for k, v in extra.items()))

    def _check(self, warm: bool) -> str | None:
        token = self.token
        saved = lb.admin_request, lb.probe_transaction_coordinator
        lb.admin_request = functools.partial(saved[0], token=token)  # type: ignore[assignment]
        lb.probe_transaction_coordinator = functools.partial(_probe_with_token, token)  # type: ignore[assignment]
        try:
            return super()._check(warm)
        finally:
            lb.admin_request, lb.probe_transaction_coordinator = saved


def _probe_with_token(token: str | None, host: str, port: int, tc_id: int, timeout: float = 30.0) -> None:
    """:func:`txn_shell.localbroker.probe_transaction_coordinator` on a connection that
    authenticates with ``token`` (CommandConnect ``auth_method_name`` 5, ``auth_data`` 3)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        connect = (lb._pb_bytes(1, b"txn-authz-probe") + lb._pb_bytes(3, (token or "").encode())
                   + lb._pb_int(4, 21) + lb._pb_bytes(5, b"token"))
        lb._send_cmd(sock, lb._CONNECT, 2, connect)
        reply = lb._recv_cmd(sock)
        if reply.get(1) != lb._CONNECTED:
            raise lb.BrokerError(f"CONNECT rejected by {host}:{port}: {reply}")
        lb._send_cmd(sock, lb._TC_CONNECT_REQ, lb._TC_CONNECT_REQ, lb._pb_int(1, 1) + lb._pb_int(2, tc_id))
        while True:
            reply = lb._recv_cmd(sock)
            if reply.get(1) == lb._PING:
                lb._send_cmd(sock, lb._PONG, lb._PONG, b"")
            elif reply.get(1) == lb._TC_CONNECT_RESP:
                resp = lb._pb_parse(reply[lb._TC_CONNECT_RESP])
                if 2 in resp:
                    raise lb.BrokerError(f"TC {tc_id} not ready (server error {resp[2]})")
                return
