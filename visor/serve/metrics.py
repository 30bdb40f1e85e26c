"""`GET /metrics` of `visor serve`: Prometheus text exposition (format 0.0.4), written by hand.

The gateway's sessions report to one `GatewayMetrics` through the same telemetry interface
`visor run` uses for OpenTelemetry (`visor.telemetry.Telemetry`, fed by `DriverTelemetry`), so a
verdict is counted exactly when its span would end: an allow once its record is durable, a deny
once it is recorded. A handful of counters, one gauge and two histograms do not justify a
dependency. Label values are bounded: verdicts and methods come from the core (a method Visor
does not gate is never reported), HTTP methods and statuses from the gateway.

Counting never changes a verdict: every report is a few dict updates under a lock (the fsync
report comes from the audit writer's thread).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: Seconds: around one fsync of a local disk (tens of µs to tens of ms) and the slow tail.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# `GET /metrics?worker-snapshot` over a worker's private unix socket (`visor serve --workers N`): that
# worker's own figures as JSON, which the worker answering a scrape of the shared port sums.
SNAPSHOT_QUERY = "worker-snapshot"


class _Histogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.count += 1
        self.total += seconds

    def snapshot(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "count": self.count, "total": self.total}

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> _Histogram:
        """A histogram from `snapshot()`'s data (another worker's); ValueError on other buckets."""
        counts = snap["counts"]
        if len(counts) != len(BUCKETS):
            raise ValueError("a histogram with other buckets")
        out = cls()
        out.counts = [int(c) for c in counts]
        out.count = int(snap["count"])
        out.total = float(snap["total"])
        return out

    def lines(self, name: str, label: str = "") -> list[str]:
        """The samples of the histogram; ``label``: ``worker="I",`` put before ``le``."""
        out = [
            f'{name}_bucket{{{label}le="{_number(b)}"}} {c}'
            for b, c in zip(BUCKETS, self.counts, strict=True)
        ]
        out.append(f'{name}_bucket{{{label}le="+Inf"}} {self.count}')
        tail = "{" + label.rstrip(",") + "}" if label else ""
        out.append(f"{name}_sum{tail} {_number(self.total)}")
        out.append(f"{name}_count{tail} {self.count}")
        return out


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _label(value: str) -> str:
    # The exposition format's escapes for a label value: backslash, double quote, line feed.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class GatewayMetrics:
    """What `/metrics` shows; a `Telemetry` for every session's relay."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[str, str], int] = {}
        self._http: dict[tuple[str, int], int] = {}
        self._pending = 0
        self._commit = _Histogram()
        self._fsync = _Histogram()
        # The HTTP server's connections: (open now, refused over its cap so far).
        self._connections: Callable[[], tuple[int, int]] = lambda: (0, 0)

    # ---------------------------------------------------------------- the Telemetry interface
    def gated(
        self,
        *,
        method: str,
        tool: str | None,
        verdict: str,
        rule: str,
        start_ns: int,
        end_ns: int,
        evaluation_s: float | None,
    ) -> None:
        with self._lock:
            key = (verdict, method)
            self._verdicts[key] = self._verdicts.get(key, 0) + 1

    def committed(self, seconds: float) -> None:
        with self._lock:
            self._commit.observe(seconds)

    def fsynced(self, seconds: float) -> None:
        with self._lock:
            self._fsync.observe(seconds)

    def approvals_pending(self, delta: int) -> None:
        with self._lock:
            self._pending += delta

    def watch_output_index(self, size: Callable[[], int]) -> None:
        return None  # per session and short-lived: not exported by the gateway

    def shutdown(self) -> None:
        return None

    # ---------------------------------------------------------------- the gateway's own
    def http_request(self, method: str, status: int) -> None:
        with self._lock:
            key = (method if method in ("GET", "POST", "DELETE") else "other", status)
            self._http[key] = self._http.get(key, 0) + 1

    def watch_connections(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Where the HTTP server's connection figures are read at each scrape: open now, and
        refused over its cap so far (a flood, or a cap too low for the sessions allowed)."""
        self._connections = counts

    def snapshot(self, sessions_open: int) -> dict[str, Any]:
        """This process's figures as JSON-able data: what a worker of `--workers N` hands the
        worker that answers a scrape (`render` puts each worker's under its own label)."""
        connections_open, connections_refused = self._connections()
        with self._lock:
            return {
                "connections_open": connections_open,
                "connections_refused": connections_refused,
                "verdicts": [[v, m, n] for (v, m), n in sorted(self._verdicts.items())],
                "http": [[m, st, n] for (m, st), n in sorted(self._http.items())],
                "sessions_open": sessions_open,
                "approvals_pending": self._pending,
                "commit": self._commit.snapshot(),
                "fsync": self._fsync.snapshot(),
            }


def render(processes: Sequence[tuple[int | None, dict[str, Any]]]) -> str:
    """The exposition page of one process's snapshot (``[(None, snapshot)]``) or of several
    workers' (``[(index, snapshot), ...]``): each worker's samples carry ``worker="I"``, so a
    counter of a restarted worker resets in its own series only, and `visor_workers_reporting`
    says how many workers answered. Raises KeyError, TypeError or ValueError on a snapshot
    that is not one (a worker's answer is checked before it is shown)."""
    labelled = any(index is not None for index, _ in processes)

    def labels(index: int | None, *pairs: tuple[str, object]) -> str:
        items = ([("worker", index)] if index is not None else []) + list(pairs)
        return "{" + ",".join(f'{k}="{_label(str(v))}"' for k, v in items) + "}" if items else ""

    verdicts, http, sessions, pending, conns, refused = [], [], [], [], [], []
    commit: list[str] = []
    fsync: list[str] = []
    for index, snap in processes:
        verdicts += [
            f"visor_requests_total{labels(index, ('verdict', v), ('method', m))} {int(n)}"
            for v, m, n in snap["verdicts"]
        ]
        http += [
            f"visor_http_requests_total{labels(index, ('method', m), ('status', int(st)))} {int(n)}"
            for m, st, n in snap["http"]
        ]
        sessions.append(f"visor_sessions_open{labels(index)} {int(snap['sessions_open'])}")
        conns.append(f"visor_http_connections_open{labels(index)} {int(snap['connections_open'])}")
        refused.append(
            f"visor_http_connections_refused_total{labels(index)} {int(snap['connections_refused'])}"
        )
        pending.append(f"visor_approvals_pending{labels(index)} {int(snap['approvals_pending'])}")
        worker = f'worker="{index}",' if index is not None else ""
        commit += _Histogram.from_snapshot(snap["commit"]).lines("visor_audit_commit_seconds", worker)
        fsync += _Histogram.from_snapshot(snap["fsync"]).lines("visor_audit_fsync_seconds", worker)
    lines = [
        "# HELP visor_requests_total Gated requests by final verdict and MCP method.",
        "# TYPE visor_requests_total counter",
        *verdicts,
        "# HELP visor_http_requests_total Requests to /mcp by HTTP method and status.",
        "# TYPE visor_http_requests_total counter",
        *http,
        "# HELP visor_http_connections_open HTTP connections open now.",
        "# TYPE visor_http_connections_open gauge",
        *conns,
        "# HELP visor_http_connections_refused_total Connections refused with 503 over the connection cap.",
        "# TYPE visor_http_connections_refused_total counter",
        *refused,
        "# HELP visor_sessions_open MCP sessions open now.",
        "# TYPE visor_sessions_open gauge",
        *sessions,
        "# HELP visor_approvals_pending Approval questions open now.",
        "# TYPE visor_approvals_pending gauge",
        *pending,
        "# HELP visor_audit_commit_seconds From an allow's record queued to durable.",
        "# TYPE visor_audit_commit_seconds histogram",
        *commit,
        "# HELP visor_audit_fsync_seconds One fsync of the audit log.",
        "# TYPE visor_audit_fsync_seconds histogram",
        *fsync,
    ]
    if labelled:
        lines += [
            "# HELP visor_workers_reporting Workers of `visor serve --workers N` whose figures this page holds.",
            "# TYPE visor_workers_reporting gauge",
            f"visor_workers_reporting {len(processes)}",
        ]
    return "\n".join(lines) + "\n"
