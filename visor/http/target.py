"""The --url of an HTTP upstream: checked at start-up, and shown without its secrets.

No HTTP library here, so `visor run` can check its arguments before anything heavy is imported.
"""

from __future__ import annotations

from urllib.parse import urlsplit


class UrlError(ValueError):
    """A --url that cannot be used."""


def check_url(url: str) -> str:
    """Refuse a URL that is not plain http(s) with a host."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it raises on a bad port
    except ValueError as exc:
        raise UrlError(f"--url {display_url(url)!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlError(f"--url must be an http:// or https:// URL with a host, not {display_url(url)!r}")
    if parts.fragment:
        raise UrlError("--url must not hold a #fragment")
    return url


def display_url(url: str) -> str:
    """The URL as errors, logs and audit records show it: no user info, no query values."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    if ":" in host:
        host = f"[{host}]"
    query = "?…" if parts.query else ""
    return f"{parts.scheme}://{host}{port}{parts.path}{query}"
