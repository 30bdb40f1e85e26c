"""The official MCP conformance suite, directly, through `visor run` and through `visor serve`.

`@modelcontextprotocol/conformance` (0.1.12) drives its server scenarios as an
MCP client over Streamable HTTP. Our stdio conformance server
(tests/servers/conformance_server.py, the tools, resources and prompts the
scenarios call) is bridged to HTTP by supergateway, twice: (a) the bridge in
front of the server, (b) the bridge in front of `visor run` (embedded default
policy) in front of the server. And (c) `visor serve --url` in front of bridge
(a): the suite speaks Streamable HTTP to Visor's own gateway, which speaks it to
the bridge. The suite must lose no check through Visor that it passes without it.

The bridge is stateful: one stdio process per MCP session, every session
kept open, so the Visor side runs many `visor run` of one server at once
(one per scenario session); and the suite calls tools without listing them
first. Both were the two ways Visor used to lose checks.

`make conformance` (and `make test`) install both packages into .venv/node
with npm; where npm cannot fetch them this test skips and says so.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.serve.serve_proc import serve

ROOT = Path(__file__).resolve().parents[2]
NODE_BIN = ROOT / ".venv" / "node" / "node_modules" / ".bin"
CONFORMANCE = NODE_BIN / "conformance"
SUPERGATEWAY = NODE_BIN / "supergateway"
SERVER = ROOT / "tests" / "servers" / "conformance_server.py"
# Properties of the HTTP bridge, not of the stdio server behind it: Host/Origin
# checks, and SSE polling/resumption (SEP-1699), which supergateway does not offer.
BRIDGE_ONLY = {"dns-rebinding-protection", "server-sse-polling"}
# Checks about SSE answers to POSTs: the gateway relays the upstream's answer as JSON when the
# upstream sent nothing before it (the specification lets a server choose), so the suite reports
# them INFO ("SSE streaming is optional"), not a failure. Only these may change so, only to INFO.
SERVE_ANSWERS_JSON = {"server-sse-multiple-streams:server-sse-streams-functional"}
WORKERS = 4
SCENARIO_TIMEOUT = 120


def _need_tools() -> None:
    missing = [p.name for p in (CONFORMANCE, SUPERGATEWAY) if not p.exists()]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed in .venv/node: `make conformance` installs "
            "@modelcontextprotocol/conformance@0.1.12 and supergateway with npm (it could not here)"
        )
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the conformance suite and supergateway need Node.js 20+")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.match(r"v(\d+)", version.strip())
    if m is None or int(m.group(1)) < 20:
        pytest.skip(
            f"node {version.strip() or '?'} is too old: the conformance suite 0.1.12 needs Node.js 20+"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bridge:
    """supergateway: stdio `command` -> Streamable HTTP on a local port, in its own process group."""

    def __init__(self, command: str, env: dict[str, str], log: Path) -> None:
        self.port = _free_port()
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [
                str(SUPERGATEWAY),
                "--stdio",
                command,
                "--outputTransport",
                "streamableHttp",
                "--stateful",
                "--port",
                str(self.port),
                "--healthEndpoint",
                "/healthz",
                "--logLevel",
                "info",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"supergateway exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise AssertionError("supergateway did not come up")

    def stop(self) -> None:
        # The bridge and every stdio session it started (each `visor run` and
        # its server) are in this one process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


def _scenarios(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [str(CONFORMANCE), "list"], capture_output=True, text=True, timeout=60, env=env
    ).stdout
    server_part = out.split("Client scenarios")[0]
    return re.findall(r"^\s+- (\S+)$", server_part, re.M)


def _run_scenario(url: str, scenario: str, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Each check of one scenario: its id -> status (SUCCESS, FAILURE, WARNING, ...)."""
    try:
        proc = subprocess.run(
            [str(CONFORMANCE), "server", "--url", url, "--scenario", scenario, "--verbose"],
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT,
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        return {f"{scenario}:(timed out)": "FAILURE"}
    text = proc.stdout
    start = text.find("\n[")
    end = text.find("\n]\n", start)
    if start < 0 or end < 0:
        return {f"{scenario}:(no checks reported)": "FAILURE"}
    checks = json.loads(text[start + 1 : end + 2])
    return {f"{scenario}:{c['id']}": c["status"] for c in checks}


def _run_suite(url: str, scenarios: list[str], env: dict[str, str], cwd: Path) -> dict[str, str]:
    results: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        for found in pool.map(lambda s: _run_scenario(url, s, env, cwd), scenarios):
            results.update(found)
    return results


def test_the_conformance_suite_loses_no_check_through_visor(tmp_path: Path) -> None:
    _need_tools()
    env = dict(os.environ)
    env["VISOR_HOME"] = str(tmp_path / "visor-home")
    env["NO_COLOR"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    python = sys.executable
    scenarios = _scenarios(env)
    assert "tools-call-simple-text" in scenarios and len(scenarios) >= 20, scenarios

    direct = Bridge(f"{python} {SERVER}", env, tmp_path / "bridge-direct.log")
    visor = Bridge(
        f"{python} -m visor.cli run --server-name conformance -- {python} {SERVER}",
        env,
        tmp_path / "bridge-visor.log",
    )
    try:
        direct.wait_ready()
        visor.wait_ready()
        for name in ("direct", "visor", "serve", "serve-home"):
            (tmp_path / name).mkdir()
        # Each scenario opens its own sessions and the suite does not always end them: room for all.
        with (
            serve(
                tmp_path / "serve-home", None, "--server-name", "conformance", "--url", direct.url,
                "--max-sessions", "1024",
            ) as gateway,
            concurrent.futures.ThreadPoolExecutor(3) as all_three,
        ):  # fmt: skip
            a = all_three.submit(_run_suite, direct.url, scenarios, env, tmp_path / "direct")
            b = all_three.submit(_run_suite, visor.url, scenarios, env, tmp_path / "visor")
            c = all_three.submit(_run_suite, gateway.url, scenarios, env, tmp_path / "serve")
            without, through, served = a.result(), b.result(), c.result()
            gateway_log = gateway.audit
    finally:
        direct.stop()
        visor.stop()

    passed_direct = {k for k, v in without.items() if v == "SUCCESS"}
    passed_visor = {k for k, v in through.items() if v == "SUCCESS"}
    summary = (
        f"direct {len(passed_direct)}/{len(without)} passed, through Visor {len(passed_visor)}/{len(through)}"
    )
    print(summary)
    assert len(passed_direct) >= 30, summary  # the comparison means something

    # The server is a real one: without Visor, no check fails but the bridge's own
    # (the SSE polling checks are warnings about the bridge's streams).
    failing_direct = sorted(k for k, v in without.items() if v == "FAILURE")
    assert all(k.split(":")[0] in BRIDGE_ONLY for k in failing_direct), failing_direct
    # Through Visor, nothing that passes without it is lost.
    lost = sorted(passed_direct - passed_visor)
    assert not lost, f"{summary}; lost through Visor: {lost}"
    # Nor through the gateway (the suite is its HTTP client; the bridge is its upstream).
    passed_serve = {k for k, v in served.items() if v == "SUCCESS"}
    print(f"through visor serve --url {len(passed_serve)}/{len(served)}")
    lost = sorted(
        k for k in passed_direct - passed_serve if not (k in SERVE_ANSWERS_JSON and served.get(k) == "INFO")
    )
    assert not lost, f"{summary}; through visor serve {len(passed_serve)}; lost through serve: {lost}"
    gateway_verify = subprocess.run(
        [python, "-m", "visor.cli", "audit", "verify", str(gateway_log)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert gateway_verify.returncode == 0, gateway_verify.stdout + gateway_verify.stderr

    # Every session kept its own log, and each verifies.
    verify = subprocess.run(
        [python, "-m", "visor.cli", "audit", "verify"], capture_output=True, text=True, timeout=120, env=env
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.count("OK ") >= 1
