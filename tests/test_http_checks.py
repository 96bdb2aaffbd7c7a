"""The browser-facing header checks any local HTTP server here applies (Host, Origin, Content-Type)."""

from __future__ import annotations

import pytest

from dgpo_edge.retrieval.http_checks import (host_is_local, host_problem, json_type_problem, origin_is_local,
                                             origin_problem)

LOCAL_ORIGINS = ["http://localhost", "http://localhost:3000", "https://LOCALHOST:8443", "http://127.0.0.1:8000",
                 "http://127.8.9.10", "http://[::1]:8000", "http://app.localhost:5173"]
FOREIGN_ORIGINS = ["null", "https://evil.example", "http://localhost.evil.example", "http://127.0.0.1.evil.example",
                   "http://10.0.0.5:8000", "file://", "chrome-extension://abc", "ftp://localhost", "http://[::1",
                   "", "localhost:8000"]


@pytest.mark.parametrize("origin", LOCAL_ORIGINS)
def test_loopback_origins_pass(origin: str) -> None:
    assert origin_is_local(origin) and origin_problem(origin) is None


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_other_origins_are_403(origin: str) -> None:
    assert not origin_is_local(origin)
    status, message = origin_problem(origin)
    assert status == 403 and "Origin" in message


def test_no_origin_passes() -> None:
    assert origin_problem(None) is None  # curl, requests, urllib: not a browser


def test_host_header() -> None:
    for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "::1", "x.localhost"):
        assert host_is_local(host) and host_problem(host, loopback_only=True) is None, host
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.nip.io", "[2001:db8::1]:80", ""):
        assert not host_is_local(host), host
        assert host_problem(host, loopback_only=True)[0] == 403
        assert host_problem(host, loopback_only=False) is None  # bound to a LAN address: names vary
    assert host_problem(None, loopback_only=True) is None  # HTTP/1.0 sends none


def test_only_application_json_bodies_pass() -> None:
    for ctype in ("application/json", "application/json; charset=utf-8", " Application/JSON ;charset=UTF-8"):
        assert json_type_problem(ctype) is None, ctype
    for ctype in (None, "", "text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/vnd.api+json", "application/json-seq"):
        status, message = json_type_problem(ctype)
        assert status == 415 and "application/json" in message, ctype
