"""`visor bench`: the same workload direct, through a byte relay, and through Visor, in one run.

Every row drives a real subprocess over real pipes with raw JSON-RPC lines
(no SDK on the client side, so the client costs the same for every row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

PY = sys.executable
ECHO_SERVER = [PY, "-m", "visor.bench.echo_server"]


@dataclass(frozen=True, slots=True)
class Workload:
    sequential: int = 2000
    pipelined: int = 20_000
    window: int = 64
    big_calls: int = 40
    huge_line_bytes: int = 1 << 30

    @classmethod
    def quick(cls) -> Workload:
        return cls(sequential=300, pipelined=3000, big_calls=8, huge_line_bytes=64 << 20)


@dataclass(slots=True)
class RowResult:
    name: str
    note: str = ""
    startup_ms: float = 0.0
    seq_p50_us: float = 0.0
    seq_p99_us: float = 0.0
    pipelined_calls_s: float = 0.0
    big_mb_s: float = 0.0
    proxy_peak_rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    command: list[str]
    note: str = ""
    proxied: bool = True


def _req(msg_id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        obj["params"] = params
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def _peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def _start(command: list[str], env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        limit=64 << 20,
        env={**os.environ, **(env or {})},
    )


async def _call(proc: asyncio.subprocess.Process, line: bytes) -> bytes:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line)
    return await proc.stdout.readline()


async def drive(row: Row, work: Workload, call_args: dict[str, Any] | None = None) -> RowResult:
    result = RowResult(row.name, row.note)
    args = call_args or {"text": "hello"}
    t0 = time.perf_counter()
    proc = await _start(row.command)
    assert proc.stdin is not None and proc.stdout is not None
    await _call(
        proc,
        _req(
            0,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            },
        ),
    )
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    listed = await _call(proc, _req(1, "tools/list"))
    result.startup_ms = (time.perf_counter() - t0) * 1000
    if b'"tools"' not in listed:
        raise RuntimeError(f"{row.name}: tools/list failed: {listed[:200]!r}")

    next_id = 10
    latencies = []
    for _ in range(work.sequential):
        line = _req(next_id, "tools/call", {"name": "echo", "arguments": args})
        s = time.perf_counter()
        resp = await _call(proc, line)
        latencies.append(time.perf_counter() - s)
        next_id += 1
    if b'"isError":true' in resp:
        result.extra["denied"] = resp[:200].decode(errors="replace")
    latencies.sort()
    result.seq_p50_us = statistics.median(latencies) * 1e6
    result.seq_p99_us = latencies[int(len(latencies) * 0.99) - 1] * 1e6

    lines = [
        _req(next_id + i, "tools/call", {"name": "echo", "arguments": args}) for i in range(work.pipelined)
    ]
    next_id += work.pipelined
    window = asyncio.Semaphore(work.window)

    async def writer() -> None:
        for line in lines:
            await window.acquire()
            proc.stdin.write(line)  # type: ignore[union-attr]
            if proc.stdin.transport.get_write_buffer_size() > 1 << 20:  # type: ignore[union-attr]
                await proc.stdin.drain()  # type: ignore[union-attr]

    async def reader() -> None:
        for _ in range(len(lines)):
            await proc.stdout.readline()  # type: ignore[union-attr]
            window.release()

    s = time.perf_counter()
    await asyncio.gather(writer(), reader())
    result.pipelined_calls_s = len(lines) / (time.perf_counter() - s)

    total = 0
    s = time.perf_counter()
    for _ in range(work.big_calls):
        resp = await _call(proc, _req(next_id, "tools/call", {"name": "big", "arguments": {}}))
        next_id += 1
        total += len(resp)
    result.big_mb_s = total / (time.perf_counter() - s) / 1e6

    if row.proxied:
        result.proxy_peak_rss_mb = _peak_rss_mb(proc.pid)
    proc.stdin.close()
    await proc.wait()
    return result


async def huge_line_rss(command: list[str], size: int) -> dict[str, float]:
    """Send `size` bytes with no newline; Visor must discard them in bounded memory."""
    proc = await _start(command)
    assert proc.stdin is not None and proc.stdout is not None
    chunk = b"a" * (1 << 20)
    s = time.perf_counter()
    sent = 0
    while sent < size:
        proc.stdin.write(chunk)
        await proc.stdin.drain()
        sent += len(chunk)
    proc.stdin.write(b"\n")
    proc.stdin.write(_req(5, "ping"))
    await proc.stdin.drain()
    first = await proc.stdout.readline()
    second = await proc.stdout.readline()
    elapsed = time.perf_counter() - s
    peak = _peak_rss_mb(proc.pid) or 0.0
    proc.stdin.close()
    await proc.wait()
    ok = b"-32600" in first and b'"id":5' in second
    return {
        "bytes": float(size),
        "seconds": elapsed,
        "peak_rss_mb": peak,
        "refused_then_continued": float(ok),
    }


def visor_command(extra: list[str], server: list[str]) -> list[str]:
    return [PY, "-m", "visor.cli", "run", "--log-level", "warning", *extra, "--", *server]


def default_rows(tmp: Path, server: list[str]) -> list[Row]:
    return [
        Row("direct", server, "client to server, no relay", proxied=False),
        Row(
            "byte relay (floor)",
            [PY, "-m", "visor.bench.byte_relay", *server],
            "copies bytes, checks nothing",
        ),
        Row(
            "visor: wire checks only",
            visor_command(["--audit-log", str(tmp / "wire.jsonl")], server),
            "framer + validator + correlation",
        ),
    ]


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render_table(results: list[RowResult]) -> str:
    direct = results[0]
    floor = results[1]
    head = f"{'row':34} {'start ms':>9} {'seq p50 µs':>11} {'seq p99 µs':>11} {'calls/s':>9} {'×direct':>8} {'×floor':>7} {'1MiB MB/s':>10} {'×floor':>7} {'RSS MB':>7}"
    out = [head, "-" * len(head)]
    for r in results:
        out.append(
            f"{r.name:34} {_fmt(r.startup_ms, 1):>9} {_fmt(r.seq_p50_us):>11} {_fmt(r.seq_p99_us):>11} "
            f"{_fmt(r.pipelined_calls_s):>9} {r.pipelined_calls_s / direct.pipelined_calls_s:>8.2f} "
            f"{r.pipelined_calls_s / floor.pipelined_calls_s:>7.2f} {_fmt(r.big_mb_s):>10} "
            f"{r.big_mb_s / floor.big_mb_s:>7.2f} {_fmt(r.proxy_peak_rss_mb, 1):>7}"
        )
    return "\n".join(out)


def check_targets(results: dict[str, RowResult], huge: dict[str, float]) -> list[tuple[str, bool, str]]:
    direct = results["direct"]
    floor = results["byte relay (floor)"]
    wire = results["visor: wire checks only"]
    return [
        (
            "pipelined calls/s through Visor >= 40% of direct",
            wire.pipelined_calls_s >= 0.4 * direct.pipelined_calls_s,
            f"{wire.pipelined_calls_s / direct.pipelined_calls_s:.0%}",
        ),
        (
            "sequential p50 within 100 µs of the floor",
            wire.seq_p50_us - floor.seq_p50_us <= 100,
            f"+{wire.seq_p50_us - floor.seq_p50_us:.0f} µs",
        ),
        (
            "1 MiB responses >= 70% of the floor",
            wire.big_mb_s >= 0.7 * floor.big_mb_s,
            f"{wire.big_mb_s / floor.big_mb_s:.0%}",
        ),
        (
            f"peak RSS < 60 MB with a {huge['bytes'] / (1 << 20):.0f} MiB line without newline",
            huge["peak_rss_mb"] < 60 and huge["refused_then_continued"] == 1.0,
            f"{huge['peak_rss_mb']:.1f} MB",
        ),
    ]


async def _bench(work: Workload, tmp: Path) -> dict[str, Any]:
    rows = default_rows(tmp, ECHO_SERVER)
    results = [await drive(row, work) for row in rows]
    huge = await huge_line_rss(
        visor_command(["--audit-log", str(tmp / "huge.jsonl")], ECHO_SERVER), work.huge_line_bytes
    )
    return {"results": results, "huge": huge}


def machine_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def run_bench(args: argparse.Namespace) -> int:
    work = Workload.quick() if getattr(args, "quick", False) else Workload()
    with tempfile.TemporaryDirectory(prefix="visor-bench-") as tmp:
        data = uvloop.run(_bench(work, Path(tmp)))
    results: list[RowResult] = data["results"]
    print(
        f"visor bench: {work.pipelined} pipelined calls (window {work.window}), {work.sequential} sequential, "
        f"{work.big_calls} x 1 MiB responses; {machine_info()['cpus']} CPUs, Python {machine_info()['python']}"
    )
    print(render_table(results))
    huge = data["huge"]
    print(
        f"\n{huge['bytes'] / (1 << 20):.0f} MiB line without newline: refused and the stream continued: "
        f"{bool(huge['refused_then_continued'])}; Visor peak RSS {huge['peak_rss_mb']:.1f} MB; {huge['seconds']:.1f} s"
    )
    targets = check_targets({r.name: r for r in results}, huge)
    print("\nTargets:")
    for name, ok, figure in targets:
        print(f"  [{'PASS' if ok else 'MISS'}] {name}: {figure}")
    payload = {
        "machine": machine_info(),
        "workload": asdict(work),
        "rows": [asdict(r) for r in results],
        "huge_line": huge,
        "targets": [{"target": n, "met": ok, "figure": f} for n, ok, f in targets],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.output) if getattr(args, "output", None) else Path("bench-results") / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nFigures written to {out}")
    return 0
