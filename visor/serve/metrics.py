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
from collections.abc import Callable
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
    def of(cls, snapshots: list[dict[str, Any]]) -> _Histogram:
        """The sum of several processes' histograms (the same buckets everywhere)."""
        merged = cls()
        for snap in snapshots:
            counts = snap["counts"]
            if len(counts) != len(BUCKETS):
                raise ValueError("a histogram with other buckets")
            merged.counts = [a + int(b) for a, b in zip(merged.counts, counts, strict=True)]
            merged.count += int(snap["count"])
            merged.total += float(snap["total"])
        return merged

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_number(b)}"}} {c}' for b, c in zip(BUCKETS, self.counts, strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_number(self.total)}")
        out.append(f"{name}_count {self.count}")
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

    def snapshot(self, sessions_open: int) -> dict[str, Any]:
        """This process's figures as JSON-able data: what a worker of `--workers N` hands the
        worker that answers a scrape, which sums them (`merge`)."""
        with self._lock:
            return {
                "verdicts": [[v, m, n] for (v, m), n in sorted(self._verdicts.items())],
                "http": [[m, st, n] for (m, st), n in sorted(self._http.items())],
                "sessions_open": sessions_open,
                "approvals_pending": self._pending,
                "commit": self._commit.snapshot(),
                "fsync": self._fsync.snapshot(),
            }

    def render(self, sessions_open: int) -> str:
        return render(merge([self.snapshot(sessions_open)]))


def merge(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of several processes' snapshots: counters, gauges and histogram buckets add up.
    Raises ValueError (or KeyError, TypeError) on a snapshot that is not one."""
    verdicts: dict[tuple[str, str], int] = {}
    http: dict[tuple[str, int], int] = {}
    for snap in snapshots:
        for v, m, n in snap["verdicts"]:
            verdicts[(str(v), str(m))] = verdicts.get((str(v), str(m)), 0) + int(n)
        for m, st, n in snap["http"]:
            http[(str(m), int(st))] = http.get((str(m), int(st)), 0) + int(n)
    return {
        "verdicts": [[v, m, n] for (v, m), n in sorted(verdicts.items())],
        "http": [[m, st, n] for (m, st), n in sorted(http.items())],
        "sessions_open": sum(int(s["sessions_open"]) for s in snapshots),
        "approvals_pending": sum(int(s["approvals_pending"]) for s in snapshots),
        "commit": _Histogram.of([s["commit"] for s in snapshots]).snapshot(),
        "fsync": _Histogram.of([s["fsync"] for s in snapshots]).snapshot(),
        "processes": len(snapshots),
    }


def render(snap: dict[str, Any], *, processes: int | None = None) -> str:
    """The exposition page of a (merged) snapshot. ``processes``: with `--workers N`, how many of
    the N workers' figures it holds (a scrape while one restarts says so, not silently less)."""
    lines = [
        "# HELP visor_requests_total Gated requests by final verdict and MCP method.",
        "# TYPE visor_requests_total counter",
        *(
            f'visor_requests_total{{verdict="{_label(v)}",method="{_label(m)}"}} {n}'
            for v, m, n in snap["verdicts"]
        ),
        "# HELP visor_http_requests_total Requests to /mcp by HTTP method and status.",
        "# TYPE visor_http_requests_total counter",
        *(f'visor_http_requests_total{{method="{m}",status="{st}"}} {n}' for m, st, n in snap["http"]),
        "# HELP visor_sessions_open MCP sessions open now.",
        "# TYPE visor_sessions_open gauge",
        f"visor_sessions_open {snap['sessions_open']}",
        "# HELP visor_approvals_pending Approval questions open now.",
        "# TYPE visor_approvals_pending gauge",
        f"visor_approvals_pending {snap['approvals_pending']}",
        "# HELP visor_audit_commit_seconds From an allow's record queued to durable.",
        "# TYPE visor_audit_commit_seconds histogram",
        *_Histogram.of([snap["commit"]]).lines("visor_audit_commit_seconds"),
        "# HELP visor_audit_fsync_seconds One fsync of the audit log.",
        "# TYPE visor_audit_fsync_seconds histogram",
        *_Histogram.of([snap["fsync"]]).lines("visor_audit_fsync_seconds"),
    ]
    if processes is not None:
        lines += [
            "# HELP visor_workers_reporting Workers of `visor serve --workers N` whose figures this page sums.",
            "# TYPE visor_workers_reporting gauge",
            f"visor_workers_reporting {processes}",
        ]
    return "\n".join(lines) + "\n"
