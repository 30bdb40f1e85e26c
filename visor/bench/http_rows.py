"""`make bench` rows for HTTP: a Streamable HTTP echo server direct, and through `visor serve --url`.

One session sequential (p50/p99 per call) and pipelined (a window of POSTs in flight), and 100
concurrent sessions (aggregate calls/s), each direct and through the gateway; the 100 sessions
again through `visor serve --workers 2` (the gateway rows are `--workers 1`); the same rows for
the gateway in front of the stdio echo server (`visor serve -- python -m visor.bench.echo_server`:
the gateway's own path, without the upstream HTTP hop); and, in the same run, the stdio pipelined
figure of `visor run` in front of the stdio echo server, which the 100-session target is measured
against. The client is Visor's own narrow HTTP/1.1 client (visor/http/client.py, no SDK) on
uvloop, the same for every row: a load generator that costs little beside what it measures.

Run: ``python -m visor.bench.http_rows [--quick] [--output FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop
from aiohttp import web

from visor.bench.scratch import ScratchError, scratch_folder
from visor.http.client import OriginClient

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
    # CPU (user + system) per call during the 100 sessions, µs: the bench client (this process),
    # the process in the middle (relay or gateway; 0 for direct) and the upstream server(s).
    sessions_cpu_us: dict[str, float]


@dataclass(frozen=True, slots=True)
class Running:
    """A process the rows started: where it listens, and its pid (CPU is read from /proc)."""

    url: str
    pid: int


def process_cpu_s(pid: int, *, descendants: bool = False) -> float:
    """Seconds on a CPU of `pid` (all its threads), or of its live descendants only.

    From each thread's schedstat (nanoseconds): /proc/PID/stat counts in clock ticks, too coarse
    for a short run.
    """
    if descendants:
        return sum(process_cpu_s(c) + process_cpu_s(c, descendants=True) for c in _children(pid))
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return total / 1e9


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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
    web.run_app(
        _echo_app(), sock=sock, print=None, access_log=None, handle_signals=True, loop=uvloop.new_event_loop()
    )


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


@contextmanager
def echo_server() -> Iterator[Running]:
    sock = _free_socket()
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [PY, "-c", f"from visor.bench.http_rows import serve_echo; serve_echo({sock.fileno()})"],
        pass_fds=(sock.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    sock.close()
    try:
        yield Running(f"http://127.0.0.1:{port}/mcp", proc.pid)
    finally:
        _stop(proc)


@contextmanager
def tcp_relay(upstream: str) -> Iterator[Running]:
    """visor.bench.tcp_relay in front of `upstream` (an http://127.0.0.1:PORT/PATH URL)."""
    host_port, _, path = upstream.removeprefix("http://").partition("/")
    host, _, port = host_port.rpartition(":")
    sock = _free_socket()
    mine = sock.getsockname()[1]
    proc = subprocess.Popen(
        [PY, "-m", "visor.bench.tcp_relay", str(sock.fileno()), host, port],
        pass_fds=(sock.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    sock.close()
    try:
        yield Running(f"http://127.0.0.1:{mine}/{path}", proc.pid)
    finally:
        _stop(proc)


def _policy_file(tmp: Path) -> Path:
    """The rows' one policy, for every Visor they start (stdio, gateway, floor)."""
    policy = tmp / "http-bench-policy.yaml"
    policy.write_text(POLICY)
    return policy


@contextmanager
def core_floor(upstream: str, tmp: Path) -> Iterator[Running]:
    """visor.bench.core_floor in front of `upstream`: Visor's judgement behind the least glue."""
    host, _, port = upstream.removeprefix("http://").partition("/")[0].rpartition(":")
    policy = _policy_file(tmp)
    sock = _free_socket()
    mine = sock.getsockname()[1]
    args = [PY, "-m", "visor.bench.core_floor", str(sock.fileno()), host, port]
    args += [str(policy), str(tmp / "core-floor-audit.jsonl")]
    env = {**os.environ, "VISOR_HOME": str(tmp / "home")}
    proc = subprocess.Popen(args, pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL, env=env)
    sock.close()
    try:
        yield Running(f"http://127.0.0.1:{mine}/mcp", proc.pid)
    finally:
        _stop(proc)


# The stdio echo server `visor run`'s rows use: the gateway's own path, with no upstream HTTP hop.
STDIO_ECHO = [PY, "-m", "visor.bench.echo_server"]


@contextmanager
def gateway(upstream: str | list[str], tmp: Path, workers: int = 1) -> Iterator[Running]:
    """`visor serve` in front of `upstream`: an HTTP server's URL, or a stdio server's argv."""
    policy = _policy_file(tmp)
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
            yield Running(url, proc.pid)
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
    """One MCP session over raw HTTP POSTs, through Visor's own narrow HTTP/1.1 client (llhttp):
    a load generator that costs a fraction of what the parts it measures do (aiohttp's client
    took 180-290 µs of CPU a call, as much as the gateway's whole budget at the sessions target)."""

    def __init__(self, url: str, *, connections: int = 1) -> None:
        # Each session keeps its own connections, as separate agents' clients do.
        self.http = OriginClient(url, connect_timeout=10.0, max_idle=connections)
        self.headers = dict(HEADERS)
        self.next_id = 0

    async def post(self, msg: dict[str, Any]) -> Any:
        async with await self.http.request("POST", self.headers, orjson.dumps(msg)) as r:
            body = await r.read(1 << 24)
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
        try:
            async with await self.http.request("DELETE", self.headers) as r:
                await r.read(1 << 16)
        finally:
            await self.http.close()


# What a row's CPU account reads: cumulative CPU seconds by part ("middle", "upstream").
CpuReader = Callable[[], dict[str, float]]


def cpu_of(middle: int | None, upstream: int | None, *, upstream_under_middle: bool = False) -> CpuReader:
    """A reader for a row: the middle process, and the upstream (a pid, or the middle's children)."""

    def read() -> dict[str, float]:
        out = {"middle": process_cpu_s(middle) if middle is not None else 0.0}
        if upstream_under_middle and middle is not None:
            out["upstream"] = process_cpu_s(middle, descendants=True)
        else:
            out["upstream"] = process_cpu_s(upstream) if upstream is not None else 0.0
        return out

    return read


async def measure(name: str, url: str, work: Work, cpu: CpuReader) -> HttpRow:
    one = McpHttp(url, connections=work.window)
    try:
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
    finally:
        await one.close()
    aggregate, per_call = await _sessions(url, work, cpu)
    q = statistics.quantiles(lat, n=100)
    return HttpRow(name, q[49] * 1e6, q[98] * 1e6, pipelined, aggregate, per_call)


async def _sessions(url: str, work: Work, cpu: CpuReader | None = None) -> tuple[float, dict[str, float]]:
    """`work.sessions` sessions at once, each making its calls one after another: calls/s in all,
    and the CPU each part spent per call meanwhile (µs; with `cpu`)."""
    sessions = [McpHttp(url) for _ in range(work.sessions)]
    await asyncio.gather(*(s.start() for s in sessions))

    async def sequential(s: McpHttp) -> None:
        for _ in range(work.calls_per_session):
            await s.call()

    calls = work.sessions * work.calls_per_session
    before = cpu() if cpu is not None else {}
    client_before = _self_cpu_s()
    t = time.perf_counter()
    await asyncio.gather(*(sequential(s) for s in sessions))
    aggregate = calls / (time.perf_counter() - t)
    per_call = {"client": (_self_cpu_s() - client_before) / calls * 1e6}
    if cpu is not None:
        after = cpu()
        per_call |= {part: (after[part] - before[part]) / calls * 1e6 for part in after}
    await asyncio.gather(*(s.close() for s in sessions))
    return aggregate, per_call


async def measure_sessions(url: str, work: Work) -> float:
    return (await _sessions(url, work))[0]


async def stdio_pipelined(tmp: Path, work: Work) -> float:
    """`visor run` in front of the stdio echo server, pipelined: the figure the sessions target uses."""
    from visor.bench.runner import ECHO_SERVER, Row, Workload, drive, visor_command

    policy = _policy_file(tmp)
    extra = ["--server-name", "bench", "--policy", str(policy), "--audit-log", str(tmp / "stdio-audit.jsonl")]
    row = Row("visor run (stdio)", visor_command(extra, ECHO_SERVER))
    # Its group store, pins and approvals go to the scratch folder, never the user's $VISOR_HOME
    # (the child inherits this process's environment, as the gateways' get it explicitly).
    home = os.environ.get("VISOR_HOME")
    os.environ["VISOR_HOME"] = str(tmp / "home")
    try:
        result = await drive(row, Workload(sequential=50, pipelined=work.pipelined, big_calls=0, micro=False))
    finally:
        if home is None:
            os.environ.pop("VISOR_HOME", None)
        else:
            os.environ["VISOR_HOME"] = home
    return result.pipelined_calls_s


def run(work: Work) -> dict[str, Any]:
    from visor.audit.probe import fsync_latency_probe

    with scratch_folder("visor-bench-http-") as name:
        tmp = Path(name)
        fsync_us = fsync_latency_probe(tmp, samples=50) * 1e6
        with echo_server() as up:
            direct = uvloop.run(measure("direct HTTP", up.url, work, cpu_of(None, up.pid)))
            with tcp_relay(up.url) as relay:
                floor = uvloop.run(measure("raw TCP relay", relay.url, work, cpu_of(relay.pid, up.pid)))
            with core_floor(up.url, tmp) as least:
                core = uvloop.run(
                    measure("Visor's core, least glue", least.url, work, cpu_of(least.pid, up.pid))
                )
            with gateway(up.url, tmp) as gw:
                through = uvloop.run(
                    measure("through visor serve --url", gw.url, work, cpu_of(gw.pid, up.pid))
                )
            with gateway(up.url, tmp, workers=2) as gw:
                workers_2 = uvloop.run(measure_sessions(gw.url, work))
        with gateway(STDIO_ECHO, tmp) as gw:
            reader = cpu_of(gw.pid, None, upstream_under_middle=True)
            own = uvloop.run(measure("through visor serve -- stdio", gw.url, work, reader))
        with gateway(STDIO_ECHO, tmp, workers=2) as gw:
            own_workers_2 = uvloop.run(measure_sessions(gw.url, work))
        # The median of three: one run moved between 5,400 and 9,500 calls/s from one minute to
        # the next on a shared machine, and the sessions target divides by it.
        stdio_runs = sorted(uvloop.run(stdio_pipelined(tmp, work)) for _ in range(3))
        stdio = stdio_runs[1]
    added = through.seq_p50_us - direct.seq_p50_us
    core_added = core.seq_p50_us - direct.seq_p50_us
    return {
        "work": asdict(work),
        "fsync_us": fsync_us,
        "rows": [asdict(direct), asdict(through), asdict(own), asdict(floor), asdict(core)],
        "stdio_pipelined_calls_s": stdio,
        "stdio_pipelined_runs_calls_s": stdio_runs,
        # The 100-session figure through the gateway by worker count (1: the row above).
        "sessions_calls_s_by_workers": {"1": through.sessions_calls_s, "2": workers_2},
        "stdio_sessions_calls_s_by_workers": {"1": own.sessions_calls_s, "2": own_workers_2},
        # The gateway in front of the stdio server, over direct HTTP to the HTTP echo server: the
        # gateway's own path (aiohttp in, the session's relay, the fsync'd commit, routing back).
        "own_path_added_p50_us": own.seq_p50_us - direct.seq_p50_us,
        # What any process in the middle costs here: the raw TCP relay over direct HTTP.
        "relay_added_p50_us": floor.seq_p50_us - direct.seq_p50_us,
        "sessions_cpu_budget": _budget(through, stdio),
        # Visor's judgement behind protocol callbacks only (visor.bench.core_floor): what the
        # targets would read if the gateway's I/O layers cost nothing beyond the parsing.
        "core_floor": {
            "added_p50_us": core_added,
            "added_p50_met": core_added <= fsync_us + 300,
            "sessions_vs_stdio_pipelined": core.sessions_calls_s / stdio,
            "sessions_met": core.sessions_calls_s >= 0.6 * stdio,
        },
        "targets": {
            "added_p50_us": added,
            "added_p50_limit_us": fsync_us + 300,
            "added_p50_met": added <= fsync_us + 300,
            "sessions_vs_stdio_pipelined": through.sessions_calls_s / stdio,
            "sessions_met": through.sessions_calls_s >= 0.6 * stdio,
        },
    }


def _budget(through: HttpRow, stdio_pipelined: float) -> dict[str, Any]:
    """What the machine's cores allow per call at the sessions target, and who took how much."""
    cores = os.cpu_count() or 1
    rate = 0.6 * stdio_pipelined
    per_call = cores * 1e6 / rate
    cpu = through.sessions_cpu_us
    others = cpu["client"] + cpu.get("upstream", 0.0)
    return {
        "cores": cores,
        "target_calls_s": rate,
        "per_call_us": per_call,
        "client_and_upstream_us": others,
        "left_for_gateway_us": per_call - others,
        "gateway_used_us": cpu.get("middle", 0.0),
    }


def render(data: dict[str, Any]) -> str:
    w = data["work"]
    lines = [
        f"HTTP rows: {w['sequential']} sequential, {w['pipelined']} pipelined (window {w['window']}), "
        f"{w['sessions']} sessions x {w['calls_per_session']} calls; raw fsync median {data['fsync_us']:.0f} µs",
        f"{'row':<28} {'p50 µs':>8} {'p99 µs':>8} {'pipelined/s':>12} {'sessions/s':>11}"
        f"   CPU µs per call in the sessions: client / middle / upstream",
    ]
    for r in data["rows"]:
        c = r["sessions_cpu_us"]
        lines.append(
            f"{r['name']:<28} {r['seq_p50_us']:>8.0f} {r['seq_p99_us']:>8.0f} "
            f"{r['pipelined_calls_s']:>12.0f} {r['sessions_calls_s']:>11.0f}"
            f"   {c['client']:.0f} / {c.get('middle', 0):.0f} / {c.get('upstream', 0):.0f}"
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
    lines.append(
        f"any process in the middle (raw TCP relay over direct HTTP), p50: +{data['relay_added_p50_us']:.0f} µs"
    )
    least = data["core_floor"]
    lines.append(
        f"Visor's core behind the least glue (protocols only, ideal group commit): p50 "
        f"+{least['added_p50_us']:.0f} µs ({'within' if least['added_p50_met'] else 'over'} the target), "
        f"100 sessions {least['sessions_vs_stdio_pipelined']:.0%} of stdio pipelined "
        f"({'within' if least['sessions_met'] else 'under'} the target)"
    )
    t = data["targets"]
    runs = ", ".join(f"{r:.0f}" for r in data["stdio_pipelined_runs_calls_s"])
    lines.append(
        f"stdio visor run pipelined, same run: {data['stdio_pipelined_calls_s']:.0f} calls/s (median of {runs})"
    )
    budget = data["sessions_cpu_budget"]
    lines.append(
        f"CPU budget at the sessions target ({budget['target_calls_s']:.0f} calls/s on {budget['cores']} cores): "
        f"{budget['per_call_us']:.0f} µs per call for every process; the client and the upstream took "
        f"{budget['client_and_upstream_us']:.0f} in the --url row, leaving {budget['left_for_gateway_us']:.0f} "
        f"for the gateway, which used {budget['gateway_used_us']:.0f}"
    )
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
