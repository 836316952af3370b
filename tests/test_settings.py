"""The broker connection settings model (txn.settings): environment, flags, errors, and its users."""

from __future__ import annotations

import argparse
import re
import ssl
from pathlib import Path

import pytest

from coordinator_api.settings import Settings
from txn.auth import AuthenticationToken
from txn.settings import BrokerSettings, SettingsError, add_broker_arguments
from txn_shell import cli


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_broker_arguments(p)
    return p.parse_args(argv)


def test_from_env_reads_every_variable(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    s = BrokerSettings.from_env({
        "PULSAR_TXN_SERVICE_URL": "pulsar+ssl://h:6651",
        "PULSAR_TXN_ADMIN_URL": "https://h:8443",
        "PULSAR_TXN_AUTH_TOKEN": "tok",
        "PULSAR_TXN_TLS_TRUST_CERTS": str(ca),
        "PULSAR_TXN_TLS_VALIDATE_HOSTNAME": "yes",
        "PULSAR_TXN_TLS_ALLOW_INSECURE": "0",
        "UNRELATED": "1",
    })
    assert s == BrokerSettings("pulsar+ssl://h:6651", "https://h:8443", "tok", None, str(ca), True, False)


def test_flags_win_over_environment() -> None:
    env = {"PULSAR_TXN_SERVICE_URL": "pulsar://env:6650", "PULSAR_TXN_AUTH_TOKEN": "env-token",
           "PULSAR_TXN_TLS_VALIDATE_HOSTNAME": "true"}
    s = BrokerSettings.from_args(_parse(["--service-url", "pulsar://flag:6650"]), env)
    assert (s.service_url, s.auth_token, s.tls_validate_hostname) == ("pulsar://flag:6650", "env-token", True)
    s = BrokerSettings.from_args(_parse(["--auth-token", "flag-token"]), env)
    assert (s.service_url, s.auth_token) == ("pulsar://env:6650", "flag-token")
    assert BrokerSettings.from_args(_parse([]), {}) == BrokerSettings()


@pytest.mark.parametrize("env, message", [
    ({"PULSAR_TXN_SERVICE_URL": "http://h:6650"}, "pulsar:// or pulsar+ssl://"),
    ({"PULSAR_TXN_ADMIN_URL": "h:8080"}, "http:// or https://"),
    ({"PULSAR_TXN_AUTH_TOKEN": "a", "PULSAR_TXN_AUTH_TOKEN_FILE": "/f"}, "not both"),
    ({"PULSAR_TXN_TLS_TRUST_CERTS": "/nonexistent/ca.pem"}, "not found: /nonexistent/ca.pem"),
    ({"PULSAR_TXN_TLS_ALLOW_INSECURE": "maybe"}, "PULSAR_TXN_TLS_ALLOW_INSECURE must be true or false"),
])
def test_bad_settings_are_typed_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        BrokerSettings.from_env(env)


def test_missing_urls_name_the_flag_and_the_variable() -> None:
    s = BrokerSettings()
    with pytest.raises(SettingsError, match="--service-url or set PULSAR_TXN_SERVICE_URL"):
        s.require_service_url()
    with pytest.raises(SettingsError, match="--admin-url or set PULSAR_TXN_ADMIN_URL"):
        s.require_admin_url()


def test_client_and_admin_kwargs(tmp_path: Path) -> None:
    assert BrokerSettings("pulsar://h:1").client_kwargs() == {}
    assert BrokerSettings("pulsar://h:1", "http://h:2").admin_kwargs() == {}
    kw = BrokerSettings("pulsar://h:1", auth_token="t", tls_allow_insecure_connection=True).client_kwargs()
    assert set(kw) == {"authentication", "tls_allow_insecure_connection"}
    assert isinstance(kw["authentication"], AuthenticationToken) and kw["authentication"].auth_data() == b"t"

    tok = tmp_path / "token"
    tok.write_text("first\n")
    s = BrokerSettings("pulsar://h:1", "https://h:2", auth_token_file=str(tok), tls_validate_hostname=True)
    auth = s.client_kwargs()["authentication"]
    assert auth.auth_data() == b"first"
    tok.write_text("rotated\n")  # re-read at each connect
    assert auth.auth_data() == b"rotated"
    admin = s.admin_kwargs()
    assert admin["token"] == "rotated"
    assert isinstance(admin["context"], ssl.SSLContext) and admin["context"].check_hostname is True
    assert s.client_kwargs()["tls_validate_hostname"] is True
    assert BrokerSettings(auth_token="secret").redacted()["auth_token"] == "***"


def test_cli_without_service_url_exits_2_naming_the_variable(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PULSAR_TXN_SERVICE_URL", raising=False)
    rc = cli.main(["process", "--input", "persistent://public/default/i", "--output", "persistent://public/default/o",
                   "--subscription", "s", "--handler", "txn_shell.examples.handlers:upper"])
    assert rc == 2
    assert "error: no broker service URL: pass --service-url or set PULSAR_TXN_SERVICE_URL" in capsys.readouterr().err


def test_control_plane_settings_build_the_same_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AUTH_TOKEN", "PULSAR_TOKEN", "AUTH_TOKEN_FILE", "TLS_TRUST_CERTS"):
        monkeypatch.delenv("PULSAR_TXN_" + name, raising=False)
    monkeypatch.setenv("PULSAR_TXN_PULSAR_TOKEN", "old-name")
    assert Settings().broker().auth_token == "old-name"
    monkeypatch.setenv("PULSAR_TXN_AUTH_TOKEN", "new-name")
    b = Settings().broker()
    assert (b.service_url, b.admin_url, b.auth_token) == ("pulsar://127.0.0.1:6650", "http://127.0.0.1:8080",
                                                          "new-name")
    monkeypatch.setenv("PULSAR_TXN_TLS_TRUST_CERTS", str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="TLS trust certificates file not found"):
        Settings()
