"""`make bench` rows for HTTP: a Streamable HTTP echo server direct, and through `visor serve --url`.

One session sequential (p50/p99 per call) and pipelined (a window of POSTs in flight), and 100
concurrent sessions (aggregate calls/s), each direct and through the gateway; the 100 sessions
again through `visor serve --workers 2` (the gateway rows are `--workers 1`); the same rows for
the gateway in front of the stdio echo server (`visor serve -- python -m visor.bench.echo_server`:
the gateway's own path, without the upstream HTTP hop); and, in the same run, the stdio pipelined
figure of `visor run` in front of the stdio echo server, which the 100-session target is measured
against. The client is raw aiohttp (no SDK), the same for every row.

Run: ``python -m visor.bench.http_rows [--quick] [--output FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from visor.bench.scratch import ScratchError, scratch_folder

PY = sys.executable
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
POLICY = """\
version: "1.0"
default_action: deny
settings:
  session_max_calls: 0  # thousands of calls in one session: no budget
  session_timeout_seconds: 0
servers:
  - name: "bench"
    allowed: true
    tools:
      - name: "echo"
        allowed: true
"""
READY = "visor serve: listening on "


@dataclass(frozen=True, slots=True)
class Work:
    sequential: int = 1000
    pipelined: int = 5000
    window: int = 64
    sessions: int = 100
    calls_per_session: int = 50

    @classmethod
    def quick(cls) -> Work:
        return cls(sequential=200, pipelined=1000, sessions=100, calls_per_session=10)


@dataclass(frozen=True, slots=True)
class HttpRow:
    name: str
    seq_p50_us: float
    seq_p99_us: float
    pipelined_calls_s: float
    sessions_calls_s: float


# ------------------------------------------------------------------ the echo server (a subprocess)


def _echo_app() -> web.Application:
    """Just enough Streamable HTTP (2025-11-25, JSON answers) for the rows: not what is measured."""
    tools = {"tools": [{"name": "echo", "description": "Echo", "inputSchema": {"type": "object"}}]}

    async def mcp(request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            return web.Response(status=200)
        if request.method != "POST":
            return web.Response(status=405)
        msg = orjson.loads(await request.read())
        if "id" not in msg:
            return web.Response(status=202)
        method = msg.get("method")
        headers = {"Content-Type": "application/json"}
        if method == "initialize":
            result: Any = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench-echo", "version": "1"},
            }
            headers["Mcp-Session-Id"] = os.urandom(16).hex()
        elif method == "tools/list":
            result = tools
        else:
            result = {"content": [{"type": "text", "text": "hello"}]}
        body = orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/mcp", mcp)
    return app


def serve_echo(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    web.run_app(_echo_app(), sock=sock, print=None, access_log=None, handle_signals=True)


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


@contextmanager
def echo_server() -> Iterator[str]:
    sock = _free_socket()
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [PY, "-c", f"from visor.bench.http_rows import serve_echo; serve_echo({sock.fileno()})"],
        pass_fds=(sock.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    sock.close()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _stop(proc)


# The stdio echo server `visor run`'s rows use: the gateway's own path, with no upstream HTTP hop.
STDIO_ECHO = [PY, "-m", "visor.bench.echo_server"]


@contextmanager
def gateway(upstream: str | list[str], tmp: Path, workers: int = 1) -> Iterator[str]:
    """`visor serve` in front of `upstream`: an HTTP server's URL, or a stdio server's argv."""
    policy = tmp / "http-bench-policy.yaml"
    policy.write_text(POLICY)
    kind = "url" if isinstance(upstream, str) else "stdio"
    args = [PY, "-m", "visor.cli", "serve", "--listen", "127.0.0.1:0", "--server-name", "bench"]
    args += ["--policy", str(policy), "--audit-log", str(tmp / f"http-bench-audit-{kind}-{workers}.jsonl")]
    args += ["--max-sessions", "256", "--log-level", "warning", "--workers", str(workers)]
    args += ["--url", upstream] if isinstance(upstream, str) else ["--", *upstream]
    env = {**os.environ, "VISOR_HOME": str(tmp / "home")}
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(READY):
                url = line[len(READY) :].strip()
                break
        else:
            raise RuntimeError("visor serve exited before it listened")
        # Keep reading its stderr so a full pipe never stalls the gateway.
        drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
        try:
            yield url
        finally:
            _stop(proc)
            drain.wait(10)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ the client


class McpHttp:
    """One MCP session over raw HTTP POSTs."""

    def __init__(self, http: ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.headers = dict(HEADERS)
        self.next_id = 0

    async def post(self, msg: dict[str, Any]) -> Any:
        async with self.http.post(self.url, data=orjson.dumps(msg), headers=self.headers) as r:
            body = await r.read()
            if r.status == 202:
                return None
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
            sid = r.headers.get("Mcp-Session-Id")
            if sid:
                self.headers["Mcp-Session-Id"] = sid
            if r.content_type == "text/event-stream":
                data = [ln[5:].strip() for ln in body.split(b"\n") if ln.startswith(b"data:")]
                return orjson.loads(data[-1])
            return orjson.loads(body)

    async def start(self) -> None:
        params = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "b", "version": "1"},
        }
        await self.request("initialize", params)
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await self.request("tools/list", {})

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        answer = await self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if "result" not in answer:
            raise RuntimeError(f"{method}: {answer}")
        return answer["result"]

    async def call(self) -> None:
        result = await self.request("tools/call", {"name": "echo", "arguments": {"text": "hello"}})
        if result.get("isError"):
            raise RuntimeError(f"the echo call was refused: {result}")

    async def close(self) -> None:
        async with self.http.delete(self.url, headers=self.headers):
            pass


async def measure(name: str, url: str, work: Work) -> HttpRow:
    connector = TCPConnector(limit=0)
    async with ClientSession(connector=connector, timeout=ClientTimeout(total=120)) as http:
        one = McpHttp(http, url)
        await one.start()
        for _ in range(20):  # warm up
            await one.call()
        lat: list[float] = []
        for _ in range(work.sequential):
            t = time.perf_counter()
            await one.call()
            lat.append(time.perf_counter() - t)
        gate = asyncio.Semaphore(work.window)

        async def windowed() -> None:
            async with gate:
                await one.call()

        t = time.perf_counter()
        await asyncio.gather(*(windowed() for _ in range(work.pipelined)))
        pipelined = work.pipelined / (time.perf_counter() - t)
        await one.close()
        aggregate = await _sessions(http, url, work)
    q = statistics.quantiles(lat, n=100)
    return HttpRow(name, q[49] * 1e6, q[98] * 1e6, pipelined, aggregate)


async def _sessions(http: ClientSession, url: str, work: Work) -> float:
    """`work.sessions` sessions at once, each making its calls one after another: calls/s in all."""
    sessions = [McpHttp(http, url) for _ in range(work.sessions)]
    await asyncio.gather(*(s.start() for s in sessions))

    async def sequential(s: McpHttp) -> None:
        for _ in range(work.calls_per_session):
            await s.call()

    t = time.perf_counter()
    await asyncio.gather(*(sequential(s) for s in sessions))
    aggregate = work.sessions * work.calls_per_session / (time.perf_counter() - t)
    await asyncio.gather(*(s.close() for s in sessions))
    return aggregate


async def measure_sessions(url: str, work: Work) -> float:
    async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=120)) as http:
        return await _sessions(http, url, work)


async def stdio_pipelined(tmp: Path, work: Work) -> float:
    """`visor run` in front of the stdio echo server, pipelined: the figure the sessions target uses."""
    from visor.bench.runner import ECHO_SERVER, Row, Workload, drive, visor_command

    policy = tmp / "stdio-bench-policy.yaml"
    policy.write_text(POLICY)
    extra = ["--server-name", "bench", "--policy", str(policy), "--audit-log", str(tmp / "stdio-audit.jsonl")]
    row = Row("visor run (stdio)", visor_command(extra, ECHO_SERVER))
    result = await drive(row, Workload(sequential=50, pipelined=work.pipelined, big_calls=0, micro=False))
    return result.pipelined_calls_s


def run(work: Work) -> dict[str, Any]:
    from visor.audit.probe import fsync_latency_probe

    with scratch_folder("visor-bench-http-") as name:
        tmp = Path(name)
        fsync_us = fsync_latency_probe(tmp, samples=50) * 1e6
        with echo_server() as upstream:
            direct = asyncio.run(measure("direct HTTP", upstream, work))
            with gateway(upstream, tmp) as url:
                through = asyncio.run(measure("through visor serve --url", url, work))
            with gateway(upstream, tmp, workers=2) as url:
                workers_2 = asyncio.run(measure_sessions(url, work))
        with gateway(STDIO_ECHO, tmp) as url:
            own = asyncio.run(measure("through visor serve -- stdio", url, work))
        with gateway(STDIO_ECHO, tmp, workers=2) as url:
            own_workers_2 = asyncio.run(measure_sessions(url, work))
        stdio = asyncio.run(stdio_pipelined(tmp, work))
    added = through.seq_p50_us - direct.seq_p50_us
    return {
        "work": asdict(work),
        "fsync_us": fsync_us,
        "rows": [asdict(direct), asdict(through), asdict(own)],
        "stdio_pipelined_calls_s": stdio,
        # The 100-session figure through the gateway by worker count (1: the row above).
        "sessions_calls_s_by_workers": {"1": through.sessions_calls_s, "2": workers_2},
        "stdio_sessions_calls_s_by_workers": {"1": own.sessions_calls_s, "2": own_workers_2},
        # The gateway in front of the stdio server, over direct HTTP to the HTTP echo server: the
        # gateway's own path (aiohttp in, the session's relay, the fsync'd commit, routing back).
        "own_path_added_p50_us": own.seq_p50_us - direct.seq_p50_us,
        "targets": {
            "added_p50_us": added,
            "added_p50_limit_us": fsync_us + 300,
            "added_p50_met": added <= fsync_us + 300,
            "sessions_vs_stdio_pipelined": through.sessions_calls_s / stdio,
            "sessions_met": through.sessions_calls_s >= 0.6 * stdio,
        },
    }


def render(data: dict[str, Any]) -> str:
    w = data["work"]
    lines = [
        f"HTTP rows: {w['sequential']} sequential, {w['pipelined']} pipelined (window {w['window']}), "
        f"{w['sessions']} sessions x {w['calls_per_session']} calls; raw fsync median {data['fsync_us']:.0f} µs",
        f"{'row':<28} {'p50 µs':>8} {'p99 µs':>8} {'pipelined/s':>12} {w['sessions']} sessions calls/s",
    ]
    for r in data["rows"]:
        lines.append(
            f"{r['name']:<28} {r['seq_p50_us']:>8.0f} {r['seq_p99_us']:>8.0f} "
            f"{r['pipelined_calls_s']:>12.0f} {r['sessions_calls_s']:>10.0f}"
        )
    by_workers = data["sessions_calls_s_by_workers"]
    lines.append(
        f"{w['sessions']} sessions through visor serve --url: --workers 1 {by_workers['1']:.0f} calls/s, "
        f"--workers 2 {by_workers['2']:.0f} calls/s"
    )
    by_workers = data["stdio_sessions_calls_s_by_workers"]
    lines.append(
        f"{w['sessions']} sessions through visor serve -- stdio: --workers 1 {by_workers['1']:.0f} calls/s, "
        f"--workers 2 {by_workers['2']:.0f} calls/s"
    )
    lines.append(
        f"the gateway's own path (serve -- stdio over direct HTTP), p50: +{data['own_path_added_p50_us']:.0f} µs"
    )
    t = data["targets"]
    lines.append(f"stdio visor run pipelined, same run: {data['stdio_pipelined_calls_s']:.0f} calls/s")
    lines.append(
        f"target added p50 <= fsync + 300 µs ({t['added_p50_limit_us']:.0f} µs): {t['added_p50_us']:.0f} µs, "
        + ("met" if t["added_p50_met"] else "NOT met")
    )
    lines.append(
        f"target 100 sessions >= 60% of stdio pipelined: {t['sessions_vs_stdio_pipelined']:.0%}, "
        + ("met" if t["sessions_met"] else "NOT met")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m visor.bench.http_rows", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    parser.add_argument("--output", metavar="FILE", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    try:
        data = run(Work.quick() if args.quick else Work())
    except ScratchError as exc:
        print(f"python -m visor.bench.http_rows: {exc}", file=sys.stderr)
        return 1
    print(render(data))
    if args.output:
        Path(args.output).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
