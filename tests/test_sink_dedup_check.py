"""The sink's deduplication check against an admin API that is briefly unreachable or failing.

While a topic's owner broker is dead, the admin API redirects topic requests to it until ownership
moves (tests/test_spark_cluster_failover.py does that on the real cluster). Here a loopback HTTP
server plays the admin API's answers, so the bounds are checked exactly: transient failures are
retried until the deadline, anything else fails at once with the status.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from spark_jobs.sink_runtime import SinkError, deduplication_enabled
from txn_shell.localbroker import free_port

TOPIC = "persistent://public/default/out"


class _Admin(http.server.BaseHTTPRequestHandler):
    answers: list[tuple[int, object]] = []
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append(self.path)
        status, body = type(self).answers.pop(0) if len(type(self).answers) > 1 else type(self).answers[0]
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def admin() -> Iterator[str]:
    _Admin.answers, _Admin.seen = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Admin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_5xx_answers_are_retried_until_the_policy_is_read(admin: str) -> None:
    _Admin.answers = [(503, {"reason": "owner unavailable"}), (500, {"reason": "x"}), (200, True)]
    assert deduplication_enabled(admin, TOPIC, retry_s=10) is True
    assert len(_Admin.seen) == 3 and all("/deduplicationEnabled?applied=true" in p for p in _Admin.seen)


def test_a_4xx_answer_fails_at_once_with_its_status(admin: str) -> None:
    _Admin.answers = [(403, {"reason": "not allowed"})]
    with pytest.raises(SinkError, match="HTTP 403") as info:
        deduplication_enabled(admin, TOPIC, retry_s=10)
    assert info.value.status == 403 and len(_Admin.seen) == 1


def test_an_unreachable_admin_api_fails_after_the_deadline() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    with pytest.raises(SinkError, match="cannot reach the admin API") as info:
        deduplication_enabled(url, TOPIC, retry_s=2)
    assert isinstance(info.value.__cause__, OSError) and info.value.status is None


def test_a_persistent_5xx_fails_after_the_deadline_with_the_status(admin: str) -> None:
    _Admin.answers = [(503, {"reason": "owner unavailable"})]
    with pytest.raises(SinkError, match="HTTP 503") as info:
        deduplication_enabled(admin, TOPIC, retry_s=1.5)
    assert info.value.status == 503 and 2 <= len(_Admin.seen) <= 5
