"""Browser-facing checks for HTTP servers that run on the user's machine.

A local server is reachable by every web page the user opens: the page cannot
read a cross-origin answer, but it can make the server *do* things (a
"simple" POST needs no CORS preflight), and a page whose DNS name is rebound
to 127.0.0.1 can read answers too. Three header checks close that, and they
are pure functions of header values so that any server here (the stdlib
`/retrieve` server, an ASGI app) applies the same rules:

- `host_problem`: a loopback-bound server answers only requests addressed to
  a loopback literal or `localhost` (DNS rebinding sends the page's own name).
- `origin_problem`: browsers send `Origin` on every cross-origin request and
  every POST; only loopback origins (or none, as non-browser clients send)
  pass.
- `json_type_problem`: a request body must be declared `application/json`;
  a page can send that type cross-origin only after a preflight that these
  servers never approve, while no type, text/plain and form types need none.

Each returns None when the request passes, else `(status, message)`: 403 for
Host and Origin, 415 for the content type.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

Problem = tuple[int, str]


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback IP literal (an IPv6 zone suffix is ignored)."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _is_local_name(host: str) -> bool:
    host = host.lower()
    return host == "localhost" or host.endswith(".localhost") or is_loopback(host)


def host_is_local(host_header: str) -> bool:
    """Whether a Host header (`name`, `name:port`, `[v6]:port`) names this machine."""
    host = host_header.strip()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return _is_local_name(host)


def origin_is_local(origin: str) -> bool:
    """Whether an Origin header is an http(s) origin on this machine.

    `null` (sandboxed frames, file pages) and anything unparsable are foreign.
    """
    try:
        parts = urllib.parse.urlsplit(origin.strip())
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(host) and _is_local_name(host)


def host_problem(host_header: str | None, loopback_only: bool) -> Problem | None:
    """403 for a loopback-bound server addressed by a foreign name."""
    if loopback_only and host_header is not None and not host_is_local(host_header):
        return 403, (f"Host {host_header!r} is not a loopback name; this server only answers "
                     "requests addressed to localhost or 127.0.0.1")
    return None


def origin_problem(origin: str | None) -> Problem | None:
    """403 for a request a web page on another origin sent."""
    if origin is not None and not origin_is_local(origin):
        return 403, (f"Origin {origin[:100]!r} is not this machine; requests from web pages "
                     "are refused")
    return None


def json_type_problem(content_type: str | None) -> Problem | None:
    """415 unless the body is declared `application/json` (parameters such as charset allowed)."""
    if content_type is None:
        return 415, "the request has no Content-Type; send the body as application/json"
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json":
        return 415, f"Content-Type {media!r} is not application/json; send application/json"
    return None
