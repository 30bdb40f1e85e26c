"""mcp-visor policies keep their meaning in Visor: redaction.sensitive_files on
tool calls, the defaults of omitted settings, max_export_rows and server
attestation (stdio_invocation_sha256_v1)."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy import attestation
from visor.policy.evaluate import ToolCall
from visor.policy.loader import MCP_VISOR_SENSITIVE_FILES, PolicyError, load_policy, load_policy_text
from visor.policy.requests import prompt_arguments_decision
from visor.run import measure_invocation

REFERENCE = Path(__file__).parent / "data" / "mcp-visor"

# mcp-visor's defaults (internal/policy/loader.go DefaultPolicy; docs/policy-model.md)
MCP_VISOR_DEFAULTS = {
    "session_max_tools": 100,
    "session_timeout_seconds": 3600,
    "max_output_size_bytes": 10_485_760,
    "approval_timeout_seconds": 300,
    "max_argument_size_bytes": 1_048_576,
    "chain_window_size": 10,
}

ONE_TOOL = """\
version: "1.0"
default_action: deny
servers:
  - name: s
    allowed: true
    tools:
      - name: read
        allowed: true
"""


# ------------------------------------------------------------ sensitive_files


def test_sensitive_files_deny_tool_calls_as_mcp_visor_does() -> None:
    # business-hours.yaml (mcp-visor) lists "**/credentials": mcp-visor reads it
    # as (?i)^.*/credentials$ over the raw path, so a file named credentials
    # in any directory is denied, whatever its case.
    p = load_policy(REFERENCE / "business-hours.yaml")
    s = session_for(p, "filesystem")
    for path in ("/home/u/project/credentials", "/srv/CREDENTIALS", "/a/b/c/Credentials"):
        d = decide(p, s, "file_read", path=path)
        assert (d.action, d.rule) == ("deny", "path.sensitive"), (path, d)
    # a name that merely contains it is not the file
    d = decide(p, s, "file_read", path="/home/u/project/credentials.md")
    assert d.rule != "path.sensitive"


def test_relative_path_to_a_sensitive_file_is_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = policy_from(ONE_TOOL + 'redaction:\n  sensitive_files: ["**/tokens.txt"]\n')
    s = session_for(p, "s")
    for path in ("tokens.txt", "./sub/../tokens.txt", "sub/tokens.txt"):
        assert decide(p, s, "read", path=path).rule == "path.sensitive", path
    assert decide(p, s, "read", path="notes.txt").action == "allow"


def test_sensitive_files_with_characters_mcp_visor_reads_literally() -> None:
    # mcp-visor quotes everything but * and **: "[1]" is literal there, a class
    # in a doublestar glob. Both readings deny, so neither file gets through.
    p = policy_from(ONE_TOOL + 'redaction:\n  sensitive_files: ["**/dump[1].sql", "/data/**.bak"]\n')
    s = session_for(p, "s")
    for path in ("/x/dump[1].sql", "/x/dump1.sql", "/data/a/b/c.bak", "/DATA/z.BAK"):
        assert decide(p, s, "read", path=path).rule == "path.sensitive", path
    assert decide(p, s, "read", path="/x/dump2.sql").action == "allow"


def test_sensitive_files_deny_prompt_arguments() -> None:
    p = policy_from(ONE_TOOL + 'redaction:\n  sensitive_files: ["**/credentials"]\n')
    d = prompt_arguments_decision(p, {"file": "/etc/app/credentials"})
    assert d is not None and d.action == "deny"
    assert prompt_arguments_decision(p, {"file": "/etc/app/readme"}) is None


def test_omitted_sensitive_files_take_mcp_visor_defaults() -> None:
    # mcp-visor's default list has **/credentials and **/secrets, which Visor's
    # built-in list does not: a policy that names no sensitive_files gets them.
    for text in (ONE_TOOL, ONE_TOOL + "redaction:\n  output_redaction: true\n"):
        p = policy_from(text)
        assert {g.pattern for g in p.redaction.sensitive_files} == set(MCP_VISOR_SENSITIVE_FILES)
        s = session_for(p, "s")
        for path in ("/srv/app/credentials", "/srv/app/secrets", "/home/u/.npmrc", "/x/.docker/config.json"):
            assert decide(p, s, "read", path=path).rule == "path.sensitive", path
    # an explicit list replaces the defaults, as in mcp-visor (Visor's built-ins stay)
    p = policy_from(ONE_TOOL + "redaction:\n  sensitive_files: []\n")
    s = session_for(p, "s")
    assert decide(p, s, "read", path="/srv/app/credentials").action == "allow"
    assert decide(p, s, "read", path="/srv/app/.env").rule == "path.sensitive"


# ------------------------------------------------------------ settings defaults


def test_omitted_settings_take_mcp_visor_defaults() -> None:
    st = policy_from(ONE_TOOL).settings
    assert st.session_max_calls == 100
    assert st.session_timeout_seconds == 3600
    assert st.max_output_size_bytes == 10_485_760
    assert st.approval_timeout_seconds == 300
    assert st.max_argument_size_bytes == 1_048_576
    assert st.chain_window_size == 10


def test_explicit_zero_switches_a_limit_off_as_in_mcp_visor() -> None:
    st = policy_from(
        ONE_TOOL
        + "settings:\n  session_max_tools: 0\n  session_timeout_seconds: 0\n  max_output_size_bytes: 0\n"
        "  approval_timeout_seconds: 0\n  chain_window_size: 0\n"
    ).settings
    assert (st.session_max_calls, st.session_timeout_seconds, st.max_output_size_bytes) == (None, None, None)
    # these have no "off" in Visor: 0 keeps the default
    assert (st.approval_timeout_seconds, st.chain_window_size) == (300, 10)


def test_default_budget_stops_the_101st_call() -> None:
    p = policy_from(ONE_TOOL)
    s = session_for(p, "s")
    for _ in range(100):
        assert decide(p, s, "read").action == "allow"
        s.record_allowed(ToolCall("s", "read", {}))
    d = decide(p, s, "read")
    assert (d.action, d.rule) == ("deny", "budget.session_calls")
    assert "100" in d.reason


@pytest.mark.parametrize(
    "name", sorted(f.name for f in REFERENCE.glob("*.yaml") if "wrong-positions" not in f.name)
)
def test_reference_policy_carries_mcp_visor_settings(name: str) -> None:
    raw = yaml.safe_load((REFERENCE / name).read_text()) or {}
    given = raw.get("settings") or {}
    p = load_policy(REFERENCE / name)
    st = p.settings

    def expect(key: str) -> int | None:
        value = given.get(key, MCP_VISOR_DEFAULTS[key])
        return None if value == 0 else value

    assert st.session_max_calls == expect("session_max_tools")
    assert st.session_timeout_seconds == expect("session_timeout_seconds")
    assert st.max_output_size_bytes == expect("max_output_size_bytes")
    assert st.approval_timeout_seconds == given.get("approval_timeout_seconds", 300)
    assert st.max_argument_size_bytes == given.get("max_argument_size_bytes", 1_048_576)
    assert st.chain_window_size == given.get("chain_window_size", 10)
    # sensitive_files: the policy's list, or mcp-visor's default list; all of
    # them checked on tool calls (settings.sensitive_paths)
    files = (raw.get("redaction") or {}).get("sensitive_files")
    wanted = set(files) if files is not None else set(MCP_VISOR_SENSITIVE_FILES)
    assert {g.pattern for g in p.redaction.sensitive_files} == wanted
    assert {g.pattern for g in st.sensitive_paths} >= wanted


def test_nine_reference_policies_have_no_budget_of_their_own() -> None:
    # the finding: these lost their 100-call budget before the defaults matched
    names = [
        f.name
        for f in sorted(REFERENCE.glob("*.yaml"))
        if "wrong-positions" not in f.name
        and "session_max_tools" not in ((yaml.safe_load(f.read_text()) or {}).get("settings") or {})
    ]
    assert len(names) == 9
    for n in names:
        assert load_policy(REFERENCE / n).settings.session_max_calls == 100, n


# ------------------------------------------------------------ max_export_rows

EXPORT = ONE_TOOL.replace(
    "        allowed: true\n",
    "        allowed: true\n        rules:\n          - type: max_export_rows\n            rows: 100\n",
    1,
)


def test_max_export_rows_denies_over_the_limit() -> None:
    p = policy_from(EXPORT)
    s = session_for(p, "s")
    rule = "servers[s].tools[read].max_export_rows"
    # mcp-visor reads limit, rows, count, max_results; Visor reads those and more
    for args in (
        {"limit": 101},
        {"rows": 500},
        {"count": 1000},
        {"max_results": 101},
        {"query": "SELECT 1 LIMIT 5000"},
    ):
        d = decide(p, s, "read", **args)
        assert (d.action, d.rule) == ("deny", rule), args
        assert "max_export_rows" in d.reason
    for args in ({"limit": 100}, {"rows": 1}, {}):
        assert decide(p, s, "read", **args).action == "allow", args


@pytest.mark.parametrize(
    ("rule", "line", "key", "message"),
    [
        ("          - type: max_export_rows\n", 10, "rules[0].rows", "missing required key 'rows'"),
        ("          - type: max_export_rows\n            rows: 0\n", 11, "rules[0].rows", "must be >= 1"),
        (
            "          - type: max_export_rows\n            rows: 5\n            bytes: 3\n",
            12,
            "rules[0].bytes",
            "unknown key",
        ),
    ],
)
def test_max_export_rows_errors_name_line_and_key(rule: str, line: int, key: str, message: str) -> None:
    text = ONE_TOOL + "        rules:\n" + rule
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, "p.yaml")
    e = info.value
    assert (e.source, e.line, e.key) == ("p.yaml", line, "servers[0].tools[0]." + key), str(e)
    assert message in e.message


# ------------------------------------------------------------ attestation: loading

DIGEST = "sha256:" + "ab" * 32


def _attested(block: str) -> str:
    return ONE_TOOL.replace("    allowed: true\n    tools:", "    allowed: true\n" + block + "    tools:", 1)


def test_attestation_loads() -> None:
    p = policy_from(
        _attested(
            f'    attestation:\n      kind: "stdio_invocation_sha256_v1"\n      digest: "{DIGEST}"\n'
            "      entry_arg_positions: [2, 0]\n"
        )
    )
    att = p.server("s").attestation
    assert att is not None and att.kind == attestation.KIND and att.digest == DIGEST
    assert att.entry_arg_positions == (0, 2)  # order is not part of the identity
    assert att.observed is None and att.unresolved is None


@pytest.mark.parametrize(
    ("block", "line", "key", "message"),
    [
        (
            f'    attestation:\n      kind: "tpm_quote_v1"\n      digest: "{DIGEST}"\n',
            7,
            "servers[0].attestation.kind",
            "unsupported attestation kind 'tpm_quote_v1'",
        ),
        (
            '    attestation:\n      kind: "stdio_invocation_sha256_v1"\n      digest: "sha256:ABC"\n',
            8,
            "servers[0].attestation.digest",
            "sha256:<64 lower-case hex digits>",
        ),
        (
            '    attestation:\n      kind: "stdio_invocation_sha256_v1"\n',
            7,
            "servers[0].attestation.digest",
            "missing required key",
        ),
        (
            f'    attestation:\n      kind: "stdio_invocation_sha256_v1"\n      digest: "{DIGEST}"\n'
            "      entry_arg_positions: [0, 0]\n",
            9,
            "servers[0].attestation.entry_arg_positions[1]",
            "duplicate",
        ),
        (
            f'    attestation:\n      kind: "stdio_invocation_sha256_v1"\n      digest: "{DIGEST}"\n'
            "      entry_arg_positions: [-1]\n",
            9,
            "servers[0].attestation.entry_arg_positions[0]",
            "must be >= 0",
        ),
        (
            f'    attestation:\n      kind: "stdio_invocation_sha256_v1"\n      digest: "{DIGEST}"\n      path: x\n',
            9,
            "servers[0].attestation.path",
            "unknown key",
        ),
    ],
)
def test_attestation_errors_name_file_line_and_key(block: str, line: int, key: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_text(_attested(block), "att.yaml")
    e = info.value
    assert (e.source, e.line, e.key) == ("att.yaml", line, key), str(e)
    assert message in e.message
    assert str(e).startswith(f"att.yaml:{line}: {key}: ")


# ------------------------------------------------------------ attestation: the digest


def test_digest_follows_the_framed_contract() -> None:
    # Built by hand from the contract: tag | 8-byte BE index | 8-byte BE length | data.
    def frame(tag: int, index: int, data: bytes) -> bytes:
        return bytes([tag]) + index.to_bytes(8, "big") + len(data).to_bytes(8, "big") + data

    exe, entry = b"\x7fELF launcher bytes", b"print('server')\n"
    stream = (
        frame(1, 0, b"stdio_invocation_sha256_v1")
        + frame(2, 0, exe)
        + frame(3, 0, b"server.py")
        + frame(4, 0, entry)
        + frame(3, 1, b"--port")
        + frame(3, 2, b"")
    )
    want = "sha256:" + hashlib.sha256(stream).hexdigest()
    assert attestation.digest_invocation(exe, ["server.py", "--port", ""], {0: entry}) == want
    # without the entry payload it is another identity, and so is any reordering
    assert attestation.digest_invocation(exe, ["server.py", "--port", ""], {}) != want
    assert attestation.digest_invocation(exe, ["--port", "server.py", ""], {0: entry}) != want
    # framing is injective: moving bytes between executable and argument changes it
    assert attestation.digest_invocation(b"ab", ["c"], {}) != attestation.digest_invocation(b"a", ["bc"], {})


@pytest.mark.parametrize(
    ("names", "args", "runner"),
    [
        (("npx",), ["-y", "pkg"], "npx"),
        (("node", "uvx"), [], "uvx"),  # the PATH lookup's name counts too
        (("npm",), ["exec", "pkg"], "npm exec"),
        (("npm",), ["x", "pkg"], "npm x"),
        (("yarn",), ["dlx", "pkg"], "yarn dlx"),
        (("pnpm",), ["dlx", "pkg"], "pnpm dlx"),
        (("bun",), ["x", "pkg"], "bun x"),
        (("uv",), ["tool", "run", "pkg"], "uv tool run"),
        (("npm",), ["run", "x"], None),
        (("uv",), ["run", "server.py"], None),
        (("uv",), ["tool", "install", "x"], None),
        (("python3",), ["server.py"], None),
        (("npm",), ["--yes", "exec", "pkg"], None),  # options before the subcommand are not inferred
    ],
)
def test_registry_runners_are_unpinnable(names: tuple[str, ...], args: list[str], runner: str | None) -> None:
    assert attestation.unpinnable_launcher(names, args) == runner


def _script(path: Path, body: bytes) -> Path:
    path.write_bytes(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_measure_reads_the_launcher_and_declared_entries(tmp_path: Path) -> None:
    exe = _script(tmp_path / "launcher", b"#!/bin/sh\nexit 0\n")
    entry = tmp_path / "server.js"
    entry.write_bytes(b"console.log(1)\n")
    data = tmp_path / "data.db"
    data.write_bytes(b"mutable")
    digest, why = measure_invocation([str(exe), str(entry), str(data)], (0,))
    assert why is None
    assert digest == attestation.digest_invocation(
        exe.read_bytes(), [str(entry), str(data)], {0: entry.read_bytes()}
    )
    # an undeclared file argument is bound by its text only: its content may change
    data.write_bytes(b"changed")
    assert measure_invocation([str(exe), str(entry), str(data)], (0,))[0] == digest
    # the declared entry's content is bound
    entry.write_bytes(b"console.log(2)\n")
    assert measure_invocation([str(exe), str(entry), str(data)], (0,))[0] != digest
    # a symlink to the launcher is the launcher
    link = tmp_path / "link"
    link.symlink_to(exe)
    assert (
        measure_invocation([str(link), str(entry), str(data)], (0,))[0]
        == measure_invocation([str(exe), str(entry), str(data)], (0,))[0]
    )


def test_measure_finds_the_launcher_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path / "my-server", b"#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert measure_invocation(["my-server", "a"], ())[0] == attestation.digest_invocation(
        exe.read_bytes(), ["a"], {}
    )


@pytest.mark.parametrize(
    ("setup", "positions", "why"),
    [
        (lambda d: ["npx", "-y", "some-server"], (), "registry"),
        (lambda d: [str(d / "missing")], (), "not an executable"),
        (lambda d: [str(_script(d / "s", b"x")), "only-one"], (1,), "out of range"),
        (lambda d: [str(_script(d / "s", b"x")), str(d)], (0,), "not a regular file"),
        (lambda d: [str(_script(d / "s", b"x")), str(d / "gone.js")], (0,), "cannot read"),
    ],
)
def test_unmeasurable_invocations_say_why(tmp_path: Path, setup, positions, why: str) -> None:  # type: ignore[no-untyped-def]
    digest, reason = measure_invocation(setup(tmp_path), positions)
    assert digest is None and reason is not None and why in reason


def test_evaluator_denies_every_call_unless_the_digest_matches(tmp_path: Path) -> None:
    exe = _script(tmp_path / "srv", b"#!/bin/sh\n")
    command = [str(exe), "--flag"]
    good, _ = measure_invocation(command, ())
    assert good is not None
    block = '    attestation:\n      kind: "stdio_invocation_sha256_v1"\n      digest: "{}"\n'
    calls: list[tuple[int, ...]] = []

    def measure(pos: tuple[int, ...]) -> tuple[str | None, str | None]:
        calls.append(pos)
        return measure_invocation(command, pos)

    matching = attestation.observe(policy_from(_attested(block.format(good))), "s", measure)
    d = decide(matching, session_for(matching, "s"), "read")
    assert (d.action, d.rule) == ("allow", "servers[s].tools[read]")

    other = attestation.observe(policy_from(_attested(block.format(DIGEST))), "s", measure)
    d = decide(other, session_for(other, "s"), "read")
    assert (d.action, d.rule) == ("deny", "servers[s].attestation")
    assert good in d.reason and DIGEST in d.reason

    # never measured (a policy used without `visor run`): denied, not trusted
    raw = policy_from(_attested(block.format(good)))
    d = decide(raw, session_for(raw, "s"), "read")
    assert (d.action, d.rule) == ("deny", "servers[s].attestation")

    # unresolvable launcher: denied and says why
    npx = attestation.observe(
        policy_from(_attested(block.format(good))), "s", lambda pos: measure_invocation(["npx", "x"], pos)
    )
    d = decide(npx, session_for(npx, "s"), "read")
    assert d.rule == "servers[s].attestation" and "registry" in d.reason

    # a policy without attestation measures nothing
    calls.clear()
    plain = attestation.observe(policy_from(ONE_TOOL), "s", measure)
    assert calls == [] and decide(plain, session_for(plain, "s"), "read").action == "allow"


def test_attest_command_prints_the_block_to_pin(tmp_path: Path) -> None:
    import subprocess

    entry = tmp_path / "server.py"
    entry.write_text("print(1)\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "visor.cli",
            "attest",
            "--entry-arg-position",
            "0",
            "--",
            sys.executable,
            str(entry),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    block = yaml.safe_load(proc.stdout)["attestation"]
    want, _ = measure_invocation([sys.executable, str(entry)], (0,))
    assert block == {"kind": attestation.KIND, "digest": want, "entry_arg_positions": [0]}
    # the printed block loads as a server's attestation
    text = _attested("    " + proc.stdout.replace("\n", "\n    ").rstrip() + "\n")
    assert policy_from(text).server("s").attestation.digest == want  # type: ignore[union-attr]
    bad = subprocess.run(
        [sys.executable, "-m", "visor.cli", "attest", "--", "npx", "-y", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "registry" in bad.stderr and bad.stdout == ""
