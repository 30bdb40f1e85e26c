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
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

from visor.bench.scratch import ScratchError, scratch_folder

PY = sys.executable
ECHO_SERVER = [PY, "-m", "visor.bench.echo_server"]
BENCH_POLICY = Path(__file__).with_name("policy-30-rules.yaml")


@dataclass(frozen=True, slots=True)
class Workload:
    sequential: int = 2000
    pipelined: int = 20_000
    window: int = 64
    big_calls: int = 40
    huge_line_bytes: int = 1 << 30
    provenance_outputs: int = 10_000
    micro: bool = True

    @classmethod
    def quick(cls) -> Workload:
        return cls(
            sequential=300, pipelined=3000, big_calls=8, huge_line_bytes=64 << 20, provenance_outputs=1000
        )


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
    denied: int = 0
    audit: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    command: list[str]
    note: str = ""
    proxied: bool = True
    tool: str = "echo"
    arguments: dict[str, Any] = field(default_factory=lambda: {"text": "hello"})
    warmup_outputs: int = 0  # read_ticket calls first, to fill the provenance index
    stderr_path: Path | None = None


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


async def _start(command: list[str], stderr_path: Path | None = None) -> asyncio.subprocess.Process:
    stderr: Any = asyncio.subprocess.DEVNULL
    if stderr_path is not None:
        stderr = open(stderr_path, "wb")  # noqa: SIM115 - handed to the child
    try:
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=64 << 20,
        )
    finally:
        if stderr_path is not None:
            stderr.close()


async def _call(proc: asyncio.subprocess.Process, line: bytes) -> bytes:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line)
    return await proc.stdout.readline()


async def _pipeline(proc: asyncio.subprocess.Process, lines: list[bytes], window: int) -> list[bytes]:
    assert proc.stdin is not None and proc.stdout is not None
    server_in, server_out = proc.stdin, proc.stdout  # narrowed once, for the closures below
    slots = asyncio.Semaphore(window)
    answers: list[bytes] = []

    async def writer() -> None:
        for line in lines:
            await slots.acquire()
            server_in.write(line)
            if server_in.transport.get_write_buffer_size() > 1 << 20:
                await server_in.drain()

    async def reader() -> None:
        for _ in range(len(lines)):
            answers.append(await server_out.readline())
            slots.release()

    await asyncio.gather(writer(), reader())
    return answers


async def drive(row: Row, work: Workload) -> RowResult:
    result = RowResult(row.name, row.note)
    t0 = time.perf_counter()
    proc = await _start(row.command, row.stderr_path)
    assert proc.stdin is not None and proc.stdout is not None
    init = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    }
    await _call(proc, _req(0, "initialize", init))
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    listed = await _call(proc, _req(1, "tools/list"))
    result.startup_ms = (time.perf_counter() - t0) * 1000
    if b'"tools"' not in listed:
        raise RuntimeError(f"{row.name}: tools/list failed: {listed[:200]!r}")

    next_id = 10
    if row.warmup_outputs:
        lines = [
            _req(next_id + i, "tools/call", {"name": "read_ticket", "arguments": {}})
            for i in range(row.warmup_outputs)
        ]
        next_id += len(lines)
        await _pipeline(proc, lines, work.window)

    params = {"name": row.tool, "arguments": row.arguments}
    latencies = []
    for _ in range(work.sequential):
        line = _req(next_id, "tools/call", params)
        s = time.perf_counter()
        resp = await _call(proc, line)
        latencies.append(time.perf_counter() - s)
        next_id += 1
        if b'"isError":true' in resp:
            result.denied += 1
    latencies.sort()
    result.seq_p50_us = statistics.median(latencies) * 1e6
    result.seq_p99_us = latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1e6

    lines = [_req(next_id + i, "tools/call", params) for i in range(work.pipelined)]
    next_id += work.pipelined
    s = time.perf_counter()
    answers = await _pipeline(proc, lines, work.window)
    result.pipelined_calls_s = len(lines) / (time.perf_counter() - s)
    result.denied += sum(b'"isError":true' in a for a in answers)

    total = 0
    s = time.perf_counter()
    for _ in range(work.big_calls):
        resp = await _call(proc, _req(next_id, "tools/call", {"name": "big", "arguments": {}}))
        next_id += 1
        total += len(resp)
    if work.big_calls:
        result.big_mb_s = total / (time.perf_counter() - s) / 1e6

    if row.proxied:
        result.proxy_peak_rss_mb = _peak_rss_mb(proc.pid)
    proc.stdin.close()
    await proc.wait()
    if row.stderr_path is not None:
        result.audit = _audit_stats(row.stderr_path)
    return result


def _audit_stats(path: Path) -> dict[str, Any]:
    for line in path.read_bytes().splitlines():
        if b'"audit_stats"' in line:
            data = json.loads(line)
            return {
                k: data[k] for k in ("commits", "fsyncs", "records", "largest_group", "healthy") if k in data
            }
    return {}


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
    return [PY, "-m", "visor.cli", "run", "--log-format", "json", *extra, "--", *server]


def _default_without_redaction(tmp: Path) -> Path:
    """The embedded default policy with redaction off: the cost of redaction is the difference."""
    from importlib import resources

    text = (resources.files("visor.policy") / "default.yaml").read_text()
    marker = "redaction:\n  output_redaction: true\n"
    if marker not in text:
        raise RuntimeError("the default policy's redaction section changed; update the bench")
    path = tmp / "default-no-redaction.yaml"
    path.write_text(text.replace(marker, "redaction:\n  builtin: false\n  output_redaction: false\n"))
    return path


def default_rows(tmp: Path, work: Workload) -> list[Row]:
    server = ECHO_SERVER

    def audited(name: str, extra: list[str], note: str, **kw: Any) -> Row:
        slug = "".join(c if c.isalnum() else "-" for c in name)
        return Row(
            name,
            visor_command(["--audit-log", str(tmp / f"{slug}.jsonl"), "--log-level", "info", *extra], server),
            note,
            stderr_path=tmp / f"{slug}.stderr",
            **kw,
        )

    return [
        Row("direct", server, "client to server, no relay", proxied=False),
        Row(
            "byte relay (floor)",
            [PY, "-m", "visor.bench.byte_relay", *server],
            "copies bytes, checks nothing",
        ),
        Row(
            "visor: wire checks only",
            visor_command(["--no-checks", "--log-level", "warning"], server),
            "framer, validator, correlation; no policy, no audit",
        ),
        audited(
            "visor: default policy, no fsync",
            ["--unsafe-no-fsync"],
            "audit durability OFF: records written, not fsync'd",
        ),
        audited("visor: default policy", [], "every allow fsync'd before relay (group commit)"),
        audited(
            "visor: default policy, no redaction",
            ["--policy", str(_default_without_redaction(tmp))],
            "the same, with redaction switched off (builtin: false, output_redaction: false)",
        ),
        audited(
            f"visor: 30 rules + {work.provenance_outputs} outputs",
            ["--policy", str(BENCH_POLICY), "--server-name", "bench"],
            f"send_email checked against the provenance of {work.provenance_outputs} 4 KB outputs",
            tool="send_email",
            arguments={"to": "boss@example.com", "body": "Quarterly numbers attached."},
            warmup_outputs=work.provenance_outputs,
        ),
    ]


def user_rows(
    tmp: Path, server: list[str], policy: str | None, server_name: str, tool: str, arguments: dict[str, Any]
) -> list[Row]:
    extra = ["--server-name", server_name] + (["--policy", policy] if policy else [])
    return [
        Row("direct", server, "your server, no relay", proxied=False, tool=tool, arguments=arguments),
        Row(
            "byte relay (floor)",
            [PY, "-m", "visor.bench.byte_relay", *server],
            "",
            tool=tool,
            arguments=arguments,
        ),
        Row(
            "visor",
            visor_command(["--audit-log", str(tmp / "user.jsonl"), "--log-level", "info", *extra], server),
            "your policy, durable allows",
            tool=tool,
            arguments=arguments,
            stderr_path=tmp / "user.stderr",
        ),
    ]


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render_table(results: list[RowResult]) -> str:
    direct, floor = results[0], results[1]
    head = (
        f"{'row':36} {'start ms':>8} {'p50 µs':>7} {'p99 µs':>7} {'calls/s':>8} {'×direct':>7} {'×floor':>6} "
        f"{'MiB MB/s':>8} {'×floor':>6} {'RSS MB':>6} {'calls/fsync':>11}"
    )
    out = [head, "-" * len(head)]
    for r in results:
        per_fsync = "-"
        if r.audit.get("fsyncs"):
            per_fsync = f"{r.audit['commits'] / r.audit['fsyncs']:.1f}"
        big_ratio = f"{r.big_mb_s / floor.big_mb_s:.2f}" if floor.big_mb_s else "-"
        out.append(
            f"{r.name:36} {_fmt(r.startup_ms, 0):>8} {_fmt(r.seq_p50_us):>7} {_fmt(r.seq_p99_us):>7} "
            f"{_fmt(r.pipelined_calls_s):>8} {r.pipelined_calls_s / direct.pipelined_calls_s:>7.2f} "
            f"{r.pipelined_calls_s / floor.pipelined_calls_s:>6.2f} {_fmt(r.big_mb_s):>8} {big_ratio:>6} "
            f"{_fmt(r.proxy_peak_rss_mb, 1):>6} {per_fsync:>11}"
        )
    return "\n".join(out)


def check_targets(
    rows: dict[str, RowResult], huge: dict[str, float], fsync_us: float
) -> list[tuple[str, bool, str]]:
    direct = rows["direct"]
    floor = rows["byte relay (floor)"]
    wire = rows["visor: wire checks only"]
    nosync = rows["visor: default policy, no fsync"]
    durable = rows["visor: default policy"]
    targets = [
        (
            "pipelined calls/s, wire checks only, >= 40% of direct",
            wire.pipelined_calls_s >= 0.4 * direct.pipelined_calls_s,
            f"{wire.pipelined_calls_s / direct.pipelined_calls_s:.0%}",
        ),
        (
            "sequential p50, wire checks only, within 100 µs of the floor",
            wire.seq_p50_us - floor.seq_p50_us <= 100,
            f"{wire.seq_p50_us - floor.seq_p50_us:+.0f} µs",
        ),
        (
            "1 MiB responses, wire checks only, >= 70% of the floor",
            wire.big_mb_s >= 0.7 * floor.big_mb_s,
            f"{wire.big_mb_s / floor.big_mb_s:.0%}",
        ),
        (
            f"peak RSS < 60 MB with a {huge['bytes'] / (1 << 20):.0f} MiB line without newline",
            huge["peak_rss_mb"] < 60 and huge["refused_then_continued"] == 1.0,
            f"{huge['peak_rss_mb']:.1f} MB",
        ),
        (
            "pipelined calls/s, default policy (no fsync), >= 80% of wire checks only",
            nosync.pipelined_calls_s >= 0.8 * wire.pipelined_calls_s,
            f"{nosync.pipelined_calls_s / wire.pipelined_calls_s:.0%}",
        ),
        (
            "durable commit adds <= 1.5 fsync to the sequential p50",
            durable.seq_p50_us - nosync.seq_p50_us <= 1.5 * fsync_us,
            f"+{durable.seq_p50_us - nosync.seq_p50_us:.0f} µs vs fsync {fsync_us:.0f} µs",
        ),
        (
            "1 MiB, default policy: redaction on >= 80% of redaction off",
            durable.big_mb_s >= 0.8 * rows["visor: default policy, no redaction"].big_mb_s,
            f"{durable.big_mb_s / rows['visor: default policy, no redaction'].big_mb_s:.0%}",
        ),
        (
            "pipelined durable allows >= 20,000 calls/s (group commit)",
            durable.pipelined_calls_s >= 20_000,
            f"{durable.pipelined_calls_s:,.0f} calls/s",
        ),
        # Issue 16's targets: ratios within this run.
        (
            "pipelined calls/s, default policy (durable), >= 40% of wire checks only",
            durable.pipelined_calls_s >= 0.4 * wire.pipelined_calls_s,
            f"{durable.pipelined_calls_s / wire.pipelined_calls_s:.0%}",
        ),
        (
            "sequential p50, default policy (durable), <= wire checks only + one raw fsync + 50 µs",
            durable.seq_p50_us <= wire.seq_p50_us + fsync_us + 50,
            f"{durable.seq_p50_us:.0f} µs vs {wire.seq_p50_us + fsync_us + 50:.0f} µs",
        ),
    ]
    rules = next((r for name, r in rows.items() if name.startswith("visor: 30 rules")), None)
    if rules is not None:
        targets.append(
            (
                "pipelined calls/s, 30 rules + outputs, >= 30% of wire checks only",
                rules.pipelined_calls_s >= 0.3 * wire.pipelined_calls_s,
                f"{rules.pipelined_calls_s / wire.pipelined_calls_s:.0%}",
            )
        )
    targets.append(
        (
            "first tools/list answer, default policy, <= direct + 80 ms",
            durable.startup_ms <= direct.startup_ms + 80,
            f"+{durable.startup_ms - direct.startup_ms:.0f} ms",
        )
    )
    default_rss = [
        r.proxy_peak_rss_mb or 0.0 for name, r in rows.items() if name.startswith("visor: default policy")
    ]
    targets.append(
        (
            "peak RSS < 40 MB, default policy rows",
            max(default_rss) < 40,
            f"{max(default_rss):.1f} MB at most",
        )
    )
    return targets


def _progress(enabled: bool) -> Any:
    """A function that says on stderr what runs now (stdout carries the table and nothing else)."""

    def say(text: str) -> None:
        if enabled:
            print(f"visor bench: {text}", file=sys.stderr, flush=True)

    return say


async def _bench_rows(
    rows: list[Row], work: Workload, tmp: Path, huge: bool, say: Any = None
) -> dict[str, Any]:
    say = say or _progress(False)
    results = []
    steps = len(rows) + (1 if huge else 0)
    for i, row in enumerate(rows, 1):
        say(f"[{i}/{steps}] {row.name}")
        results.append(await drive(row, work))
    data: dict[str, Any] = {"results": results}
    if huge:
        say(f"[{steps}/{steps}] a {work.huge_line_bytes >> 20} MiB line without newline")
        data["huge"] = await huge_line_rss(
            visor_command(["--no-checks", "--log-level", "warning"], ECHO_SERVER), work.huge_line_bytes
        )
    return data


def machine_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def run_bench(args: argparse.Namespace) -> int:
    from visor.audit.probe import fsync_latency_probe

    work = Workload.quick() if getattr(args, "quick", False) else Workload()
    user_server = getattr(args, "server_cmd", None)
    # progress only where a person watches (a terminal), or when asked for
    say = _progress(getattr(args, "progress", False) or sys.stderr.isatty())
    try:
        folder = scratch_folder("visor-bench-")
    except ScratchError as exc:
        print(f"visor bench: {exc}", file=sys.stderr)
        return 1
    with folder as tmp_name:
        tmp = Path(tmp_name)
        # Every visor run the bench starts keeps its group stores, pins and approvals here, never
        # in the user's own $VISOR_HOME (the children inherit this process's environment).
        os.environ["VISOR_HOME"] = str(tmp / "home")
        say("measuring this disk's fsync")
        fsync_s = fsync_latency_probe(tmp, samples=50)
        if user_server:
            rows = user_rows(
                tmp,
                shlex.split(user_server),
                args.policy,
                args.server_name,
                args.tool,
                json.loads(args.arguments),
            )
            work = Workload(sequential=work.sequential, pipelined=work.pipelined, big_calls=0, micro=False)
        else:
            rows = default_rows(tmp, work)
        data = uvloop.run(_bench_rows(rows, work, tmp, huge=not user_server, say=say))
    results: list[RowResult] = data["results"]
    info = machine_info()
    print(
        f"visor bench: {work.pipelined} pipelined calls (window {work.window}), {work.sequential} sequential, "
        f"{work.big_calls} x 1 MiB responses; {info['cpus']} CPUs, Python {info['python']}, {info['platform']}"
    )
    print(
        f"disk: raw fsync (64-byte append + fdatasync) median {fsync_s * 1e6:.0f} µs, in the working directory\n"
    )
    print(render_table(results))
    for r in results:
        if r.denied:
            print(f"  note: {r.name}: {r.denied} calls were denied")
        if r.audit and not r.audit.get("healthy", True):
            print(f"  note: {r.name}: the audit log became unhealthy")
    payload: dict[str, Any] = {
        "machine": info,
        "workload": asdict(work),
        "fsync_median_us": fsync_s * 1e6,
        "rows": [asdict(r) for r in results],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not user_server:
        huge = data["huge"]
        print(
            f"\n{huge['bytes'] / (1 << 20):.0f} MiB line without newline: refused and the stream continued: "
            f"{bool(huge['refused_then_continued'])}; Visor peak RSS {huge['peak_rss_mb']:.1f} MB; {huge['seconds']:.1f} s"
        )
        targets = check_targets({r.name: r for r in results}, huge, fsync_s * 1e6)
        print("\nTargets:")
        for name, ok, figure in targets:
            print(f"  [{'PASS' if ok else 'MISS'}] {name}: {figure}")
        payload["huge_line"] = huge
        payload["targets"] = [{"target": n, "met": ok, "figure": f} for n, ok, f in targets]
    if work.micro:
        from visor.bench.micro import run_micro

        say("micro-benchmarks of the hot functions")
        micro = run_micro(work.provenance_outputs)
        print("\nHot functions (median ns per call):")
        for name, ns in micro.items():
            print(f"  {ns:>12,.0f}  {name}")
        payload["micro_ns"] = micro
    out = Path(args.output) if getattr(args, "output", None) else Path("bench-results") / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nFigures written to {out}")
    return 0
