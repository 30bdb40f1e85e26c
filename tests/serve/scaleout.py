"""Real nginx for the scale-out test, in a tmp dir on a free port, with TLS (redis-server is
tests/state/redis_server.py's).

nginx runs the shipped `docs/deploy/nginx.conf` with only addresses, ports, paths and the user
substituted (`nginx_config`), so the documented file is the tested one; `directives` parses a
config so a test can hold the two side by side.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.serve.serve_proc import ROOT

SHIPPED_NGINX = ROOT / "docs" / "deploy" / "nginx.conf"
SHIPPED_COMPOSE = ROOT / "docs" / "deploy" / "compose.yaml"
TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
# The directives whose values name a place on this machine; every other one is kept verbatim.
SUBSTITUTED = frozenset(
    {"user", "pid", "error_log", "access_log", "listen", "server_name", "server",
     "ssl_certificate", "ssl_certificate_key", *(f"{t}_temp_path" for t in TEMP_PATHS)}
)  # fmt: skip
_START_DEADLINE = 30.0


def missing(binary: str, package: str) -> str | None:
    """The skip reason when a service binary is not installed, naming its Debian package."""
    if shutil.which(binary) is None and not Path("/usr/sbin", binary).exists():
        return f"{binary} is not installed (Debian package {package}; `make services` installs it)"
    return None


def nginx_binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    """Until something accepts on the port (a readiness wait with a deadline, not an assertion
    about speed); the process exiting first is a failure that shows its log."""
    deadline = time.monotonic() + _START_DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace") if log.exists() else ""
            raise AssertionError(f"{what} exited with {proc.returncode} before listening:\n{text}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port} within {_START_DEADLINE} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ TLS for nginx's edge
@dataclass(frozen=True, slots=True)
class Tls:
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


def self_signed(tmp: Path) -> Tls:
    """A certificate for 127.0.0.1 (the name the test's clients use), trusted by the test only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    tmp.mkdir(parents=True, exist_ok=True)
    tls = Tls(tmp / "fullchain.pem", tmp / "privkey.pem")
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    tls.key.chmod(0o600)
    return tls


# ------------------------------------------------------------------ nginx
def _quoted(path: Path) -> str:
    """An nginx string for `path`: double quotes, with backslash and double quote escaped."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def nginx_config(shipped: str, *, prefix: Path, port: int, replicas: list[str], tls: Tls) -> str:
    """The shipped config with this machine's places put in; every other byte is kept."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    # Places are quoted: a temporary folder may hold spaces, quotes or '#' ("/tmp/Jane Doe/").
    subs: list[tuple[str, str]] = [
        (r"(?m)^(\s*)user \S+;", f"user {user};"),
        (r"(?m)^(\s*)pid \S+;", f"pid {_quoted(prefix / 'nginx.pid')};"),
        (r"(?m)^(\s*)error_log \S+", f"error_log {_quoted(prefix / 'error.log')}"),
        (r"(?m)^(\s*)access_log \S+;", f"access_log {_quoted(prefix / 'access.log')};"),
        (r"(?m)^(\s*)listen 443 ssl", f"listen 127.0.0.1:{port} ssl"),
        (r"(?m)^(\s*)server_name mcp\.example\.org;", "server_name 127.0.0.1;"),
        (r"(?m)^(\s*)ssl_certificate \S+;", f"ssl_certificate {_quoted(tls.cert)};"),
        (r"(?m)^(\s*)ssl_certificate_key \S+;", f"ssl_certificate_key {_quoted(tls.key)};"),
    ]
    for temp in TEMP_PATHS:
        subs.append(
            (rf"(?m)^(\s*){temp}_temp_path \S+;", f"{temp}_temp_path {_quoted(prefix / 'temp' / temp)};")
        )
    text = shipped
    for pattern, directive in subs:
        # A function, not a template: a backslash in a place must stay a backslash.
        text, n = re.subn(pattern, lambda m, d=directive: m.group(1) + d, text)  # type: ignore[misc]
        assert n >= 1, f"the shipped nginx.conf no longer has {pattern!r}"
    # Each replica appears in every upstream block (first in its own, `backup` in the others):
    # replicaN, wherever it appears, becomes the Nth address.
    shipped_servers = list(dict.fromkeys(re.findall(r"(?m)^\s*server (replica\d+:\d+)", text)))
    assert len(shipped_servers) == len(replicas), (shipped_servers, replicas)
    for name, address in zip(shipped_servers, replicas, strict=True):
        text = re.sub(rf"(?m)^(\s*)server {re.escape(name)}(?=[\s;])", rf"\1server {address}", text)
    return text


def directives(text: str) -> list[tuple[tuple[str, ...], str, tuple[str, ...]]]:
    """Every directive as (enclosing blocks, name, arguments): comments dropped, quotes kept
    as written, so two configs compare directive by directive."""
    tokens = re.findall(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|#[^\n]*|[{};]|[^\s{};'\"#]+", text)
    out: list[tuple[tuple[str, ...], str, tuple[str, ...]]] = []
    stack: list[str] = []
    words: list[str] = []
    for token in tokens:
        if token.startswith("#"):
            continue
        if token == "{":
            out.append((tuple(stack), words[0], tuple(words[1:])))
            stack.append(words[0])
            words = []
        elif token == "}":
            assert not words, f"unterminated directive {words}"
            stack.pop()
        elif token == ";":
            out.append((tuple(stack), words[0], tuple(words[1:])))
            words = []
        else:
            words.append(token)
    assert not stack and not words, "unbalanced config"
    return out


def upstreams(text: str) -> dict[str, list[tuple[str, ...]]]:
    """Each upstream block's `server` lines (address and parameters), in order."""
    out: dict[str, list[tuple[str, ...]]] = {}
    current = ""
    for ctx, name, args in directives(text):
        if name == "upstream":
            current = args[0]
            out[current] = []
        elif name == "server" and ctx and ctx[-1] == "upstream":
            out[current].append(args)
    return out


ROUTE_KEY = '"$http_mcp_session_id:$http_mcp_protocol_version"'


def session_routes(text: str) -> dict[str, str]:
    """The map from `Mcp-Session-Id:MCP-Protocol-Version` to an upstream block, as
    `{pattern or "default": block}` (quotes dropped)."""
    maps = [args for _, name, args in directives(text) if name == "map"]
    assert maps == [(ROUTE_KEY, "$visor_pool")], maps
    return {name.strip('"'): args[0] for ctx, name, args in directives(text) if ctx and ctx[-1] == "map"}


@dataclass
class Nginx:
    proc: subprocess.Popen[bytes]
    port: int
    prefix: Path
    config: str

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/mcp"

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def nginx(tmp: Path, replicas: list[str], tls: Tls) -> Iterator[Nginx]:
    """nginx in the foreground as the current user, everything it writes under `tmp`."""
    prefix = tmp / "nginx"
    for temp in TEMP_PATHS:
        (prefix / "temp" / temp).mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = nginx_config(SHIPPED_NGINX.read_text(), prefix=prefix, port=port, replicas=replicas, tls=tls)
    conf = prefix / "nginx.conf"
    conf.write_text(config)
    with (prefix / "stderr.log").open("wb") as stderr:
        proc = subprocess.Popen(
            [nginx_binary(), "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        _wait_listening(port, proc, "nginx", prefix / "error.log")
        yield Nginx(proc, port, prefix, config)
    finally:
        # SIGTERM is nginx's fast shutdown: open event streams are cut, not waited for.
        _stop(proc)
