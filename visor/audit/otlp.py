"""Audit records as OTLP logs over HTTP with the JSON encoding (OTLP/HTTP, `application/json`).

No OpenTelemetry package is needed: the JSON form of an `ExportLogsServiceRequest`
is plain data, and the standard library posts it. Configuration follows the
OTLP exporter environment variables (endpoint, headers, timeout, protocol);
`--otlp URL` overrides the endpoint.

Each record becomes one log record whose body is the stored line exactly as
written (so a collector or SIEM can re-check its hash), with the fields a
query needs as attributes and `visor.hash` as a unique key to de-duplicate on.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from visor import __version__

# Severity numbers from the OTLP logs data model.
_INFO, _WARN = 9, 13
_WARN_EVENTS = frozenset({"deny", "reject", "decline", "pin_changed", "audit_repair"})
_ATTRIBUTES = ("server", "tool", "rule", "policy")
_RETRY_STATUS = frozenset({429, 502, 503, 504})
RETRIES = 5


class ExportError(Exception):
    """The records could not be delivered; nothing after the last delivered batch counts as exported."""


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    url: str
    headers: tuple[tuple[str, str], ...]
    timeout: float  # seconds
    service: str
    resource: tuple[tuple[str, str], ...]


def _env(name: str) -> str | None:
    """The logs-specific variable, else the general one (the OTLP exporter's rule)."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_LOGS_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")


def _pairs(text: str, what: str) -> tuple[tuple[str, str], ...]:
    """`k=v,k2=v2` with percent-encoded values (W3C baggage style, as the OTLP variables use)."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ExportError(f"{what}: {item.strip()!r} is not key=value")
        out.append((key.strip(), unquote(value.strip())))
    return tuple(out)


def _logs_url(base: str) -> str:
    """A URL with no path gets the logs path; one with a path is used as given."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ExportError(f"OTLP endpoint {base!r} is not an http:// or https:// URL")
    if parts.path in ("", "/"):
        return base.rstrip("/") + "/v1/logs"
    return base


def config_from_env(url: str | None) -> OtlpConfig:
    """The exporter's settings: `url` (from --otlp) or the OTLP endpoint variables."""
    protocol = _env("PROTOCOL")
    if protocol and protocol != "http/json":
        raise ExportError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL is {protocol!r}; Visor exports OTLP logs as http/json only "
            "(collectors accept it on the OTLP/HTTP port): set OTEL_EXPORTER_OTLP_LOGS_PROTOCOL=http/json"
        )
    if url:
        target = _logs_url(url)
    elif os.environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"):
        target = os.environ["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"]  # used as given, per the spec
        _logs_url(target)
    elif os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        target = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/logs"
        _logs_url(target)
    else:
        raise ExportError(
            "--otlp needs a URL, or OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_LOGS_ENDPOINT set"
        )
    raw_timeout = _env("TIMEOUT")
    try:
        timeout = float(raw_timeout) / 1000 if raw_timeout else 10.0
    except ValueError:
        raise ExportError(f"OTEL_EXPORTER_OTLP_TIMEOUT={raw_timeout!r} is not milliseconds") from None
    if timeout <= 0:
        raise ExportError("OTEL_EXPORTER_OTLP_TIMEOUT must be above 0")
    headers = _pairs(_env("HEADERS") or "", "OTEL_EXPORTER_OTLP_HEADERS")
    resource = _pairs(os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES")
    service = os.environ.get("OTEL_SERVICE_NAME") or dict(resource).get("service.name") or "visor"
    return OtlpConfig(target, headers, timeout, service, resource)


def _unix_nanos(ts: Any) -> str:
    try:
        when = datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        return "0"
    return str(int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000)


def _string(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def log_record(record: dict[str, Any], line: bytes, log: str, observed: str) -> dict[str, Any]:
    event = str(record.get("event"))
    attributes = [
        _string("visor.log", log),
        _string("visor.event", event),
        {"key": "visor.seq", "value": {"intValue": str(record.get("seq"))}},
        _string("visor.hash", str(record.get("hash"))),
        _string("visor.prev", str(record.get("prev"))),
        _string("visor.session", str(record.get("session"))),
        _string("event.name", f"visor.audit.{event}"),
    ]
    for field in _ATTRIBUTES:
        value = record.get(field)
        if isinstance(value, str):
            attributes.append(_string(f"visor.{field}", value))
    warn = event in _WARN_EVENTS
    return {
        "timeUnixNano": _unix_nanos(record.get("ts")),
        "observedTimeUnixNano": observed,
        "severityNumber": _WARN if warn else _INFO,
        "severityText": "WARN" if warn else "INFO",
        "body": {"stringValue": line.decode("utf-8", "replace")},
        "attributes": attributes,
    }


def request_body(config: OtlpConfig, items: Sequence[tuple[dict[str, Any], bytes, str]]) -> bytes:
    observed = str(time.time_ns())
    resource = dict(config.resource)
    resource["service.name"] = config.service
    return json.dumps(
        {
            "resourceLogs": [
                {
                    "resource": {"attributes": [_string(k, v) for k, v in resource.items()]},
                    "scopeLogs": [
                        {
                            "scope": {"name": "visor.audit", "version": __version__},
                            "logRecords": [log_record(r, line, log, observed) for r, line, log in items],
                        }
                    ],
                }
            ]
        },
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")


def send(
    config: OtlpConfig,
    items: Sequence[tuple[dict[str, Any], bytes, str]],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """POST one batch; retry what the OTLP spec calls retryable; raise ExportError otherwise."""
    body = request_body(config, items)
    delay = 1.0
    for attempt in range(RETRIES + 1):
        req = urllib.request.Request(config.url, data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        req.add_header("User-Agent", f"visor/{__version__}")
        for key, value in config.headers:
            req.add_header(key, value)
        retry_after: float | None = None
        try:
            with urllib.request.urlopen(req, timeout=config.timeout) as resp:
                answer = resp.read()
            _check_partial(answer, len(items))
            return
        except urllib.error.HTTPError as exc:
            if exc.code not in _RETRY_STATUS or attempt == RETRIES:
                detail = exc.read()[:300].decode("utf-8", "replace")
                raise ExportError(f"{config.url}: the collector answered HTTP {exc.code}: {detail}") from None
            header = exc.headers.get("Retry-After") if exc.headers else None
            if header and header.strip().isdigit():
                retry_after = min(float(header), 60.0)
        except (urllib.error.URLError, OSError) as exc:
            if attempt == RETRIES:
                reason = getattr(exc, "reason", exc)
                raise ExportError(f"{config.url}: cannot deliver: {reason}") from None
        sleep(retry_after if retry_after is not None else delay)
        delay = min(delay * 2, 30.0)


def _check_partial(answer: bytes, sent: int) -> None:
    if not answer.strip():
        return
    try:
        data = json.loads(answer)
    except ValueError:
        return  # a 2xx with a body that is not JSON still accepted everything
    partial = data.get("partialSuccess") if isinstance(data, dict) else None
    if isinstance(partial, dict):
        try:
            rejected = int(partial.get("rejectedLogRecords") or 0)
        except (TypeError, ValueError):
            rejected = 0
        if rejected:
            message = str(partial.get("errorMessage") or "no reason given")[:300]
            raise ExportError(f"the collector rejected {rejected} of {sent} record(s): {message}")
