"""Red team: session state rules (budgets, chains, taints and egress, provenance).

The agent is fooled and launders a read of a tainted file so that the session is
not tainted while the server reads the secret all the same; the sink that follows
must still be stopped by ``egress_controls``.

* A parameter typed as a pydantic model may be sent as a JSON string: the MCP Python
  SDK decodes it (``pre_parse_json``) and reads the path inside, and Visor's evaluator
  judges that reading too. A taint must be raised by the same reading.
* A path under another case is the same file on a case-insensitive file system (macOS,
  Windows): a taint, like a deny, matches every reading, case ignored.
* The policy names a tool in another case than the server lists it (``READ_FILE``,
  ``Send``): the lists that make a call stricter (taint sources, egress sinks) match
  in any case, as ``tool_chains`` and ``time_restrictions`` do.
* A server that offers its files as resources hands the same data to a
  ``resources/read`` (tests/servers/go_fs): a read whose URI matches a taint's
  patterns taints the session like the source tool's read of the same file.
* A server names what it reads by whatever its schema calls it (``name``, ``id``,
  ``endpoint``): a source read through an argument that is not path-shaped, or a URL in
  one not called ``url``, must taint as well.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from tests.policy.helpers import decide, policy_from, session_for
from tests.security.go_servers import build
from visor.policy.evaluate import ToolCall

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_taint_reader.py")]


def _policy(root: Path) -> str:
    return f"""\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: "files"
    allowed: true
    tools:
      - {{name: read_file, allowed: true}}
      - {{name: read_doc, allowed: true}}
      - {{name: read_in, allowed: true}}
      - {{name: find, allowed: true}}
      - {{name: send, allowed: true}}
taints:
  - name: payroll_read
    source_tools: [read_file, read_doc, read_in]
    source_patterns: ["{root}/payroll/**"]
egress_controls:
  - name: no_send_after_payroll
    when_tainted: payroll_read
    sink_tools: [send]
    action: deny
"""


def _files_visor(
    tmp_path: Path, policy: Path, server: list[str] = SERVER, *, cwd: Path | None = None, **env: str
) -> VisorProcess:
    """`visor run` as server "files" with no group, the server's log at tmp_path/server.jsonl
    (TAINT_LOG) and the audit log at tmp_path/audit.jsonl."""
    return VisorProcess(
        server,
        env={"TAINT_LOG": str(tmp_path / "server.jsonl"), **env},
        cwd=cwd,
        visor_args=[
            "--server-name", "files", "--policy", str(policy),
            "--audit-log", str(tmp_path / "audit.jsonl"), "--no-group",
        ],
    )  # fmt: skip


def _call(i: int, tool: str, arguments: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def _denied(resp: dict) -> bool:
    result = resp.get("result") or {}
    text = "".join(c.get("text", "") for c in result.get("content", []))
    return bool(result.get("isError")) and "Visor denied this call" in text


def _records(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_read_sent_as_a_json_string_taints_the_session(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "payroll").mkdir(parents=True)
    secret = root / "payroll" / "2026.csv"
    secret.write_text("alice,100000\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(root))
    log = tmp_path / "server.jsonl"
    vp = _files_visor(tmp_path, policy)
    try:
        init, listed = vp.open_session()
        assert "serverInfo" in init["result"]
        assert len(listed["result"]["tools"]) == 5
        # the model parameter as a JSON string: the SDK decodes it and reads the file
        vp.request(_call(1, "read_file", {"req": json.dumps({"path": str(secret)})}))
        read = vp.recv()
        assert read["id"] == 1 and not _denied(read), read
        assert "alice,100000" in json.dumps(read)
        vp.request(_call(2, "send", {"to": "eve", "body": "alice,100000"}))
        sent = vp.recv()
        assert sent["id"] == 2
    finally:
        vp.kill()
    # the server read the payroll file: the send after it is an egress after a taint
    assert _records(log)[0] == {"tool": "read_file", "path": str(secret)}
    assert _denied(sent), sent
    assert [r["tool"] for r in _records(log)] == ["read_file"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        # read_doc(name) opens its name relative to the server's working directory (Visor's too)
        ("read_doc", {"name": "payroll/2026.csv"}),
        # read_in(folder, name) joins the name to a folder given beside it
        ("read_in", {"folder": "/", "name": "payroll/2026.csv"}),
    ],
)
def test_a_read_named_by_a_non_path_argument_taints_the_session(
    tmp_path: Path, tool: str, arguments: dict
) -> None:
    root = tmp_path / "data"
    (root / "payroll").mkdir(parents=True)
    (root / "payroll" / "2026.csv").write_text("alice,100000\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(root))
    log = tmp_path / "server.jsonl"
    vp = _files_visor(tmp_path, policy, cwd=root if tool == "read_doc" else tmp_path)
    try:
        vp.open_session()
        if tool == "read_in":
            arguments = {**arguments, "folder": str(root)}
        vp.request(_call(1, tool, arguments))
        read = vp.recv()
        assert read["id"] == 1 and not _denied(read), read
        assert "alice,100000" in json.dumps(read)
        vp.request(_call(2, "send", {"to": "eve", "body": "alice,100000"}))
        sent = vp.recv()
        assert sent["id"] == 2
    finally:
        vp.kill()
    assert _records(log)[0] == {"tool": tool, **arguments}
    assert _denied(sent), sent
    assert [r["tool"] for r in _records(log)] == [tool]


def _unit_policy(root: str) -> object:
    return policy_from(_policy(Path(root)))


def test_taint_reads_a_json_string_argument_as_the_server_does() -> None:
    p = _unit_policy("/srv/data")
    s = session_for(p, "files")
    args = {"req": '{"path": "/srv/data/payroll/2026.csv"}'}
    assert decide(p, s, "read_file", **args).action == "allow"
    events = s.record_allowed(ToolCall("files", "read_file", args))
    assert [e.detail["taint"] for e in events] == ["payroll_read"]
    d = decide(p, s, "send", to="eve", body="x")
    assert (d.action, d.rule) == ("deny", "egress_controls[no_send_after_payroll]")


def test_taint_reads_a_list_sent_as_a_json_string() -> None:
    p = _unit_policy("/srv/data")
    s = session_for(p, "files")
    args = {"paths": '["/srv/data/public/a", "/srv/data/payroll/2026.csv"]'}
    s.record_allowed(ToolCall("files", "read_file", args))
    assert s.taints == {"payroll_read"}


def test_taint_matches_a_path_under_another_case() -> None:
    # macOS and Windows read /srv/Data/PAYROLL/x as /srv/data/payroll/x
    p = _unit_policy("/srv/data")
    s = session_for(p, "files")
    assert decide(p, s, "read_file", path="/srv/Data/PAYROLL/2026.csv").action == "allow"
    s.record_allowed(ToolCall("files", "read_file", {"path": "/srv/Data/PAYROLL/2026.csv"}))
    assert s.taints == {"payroll_read"}
    assert decide(p, s, "send", to="eve").rule == "egress_controls[no_send_after_payroll]"


def test_taint_still_needs_a_matching_path() -> None:
    p = _unit_policy("/srv/data")
    s = session_for(p, "files")
    for args in (
        {"path": "/srv/data/public/2026.csv"},
        {"req": '{"path": "/srv/data/public/x"}'},
        {"note": "not json {"},
    ):
        s.record_allowed(ToolCall("files", "read_file", args))
    assert not s.taints


def test_taint_reads_every_argument_as_a_path_or_a_url() -> None:
    p = policy_from(
        """
        version: "1.0"
        default_action: deny
        settings: {packs: []}
        servers:
          - name: files
            allowed: true
            tools:
              - {name: fetch, allowed: true}
              - {name: send, allowed: true}
        taints:
          - {name: internal, source_tools: [fetch], source_patterns: ["/srv/payroll/**", "**/internal/**"]}
        egress_controls:
          - {name: no_send, when_tainted: internal, sink_tools: [send], action: deny}
        """
    )
    for args in (
        {"endpoint": "https://intranet.example/internal/report"},
        {"link": "HTTPS://intranet.example/%69nternal/report"},
        {"request": {"href": "https://intranet.example/internal/x"}},
        {"id": "/srv/payroll/2026.csv"},
        {"ids": ["a", "/srv/payroll/2026.csv"]},
        {"by_name": {"/srv/payroll/2026.csv": True}},
    ):
        s = session_for(p, "files")
        s.record_allowed(ToolCall("files", "fetch", args))
        assert s.taints == {"internal"}, args
        assert decide(p, s, "send", to="eve").action == "deny", args
    s = session_for(p, "files")
    s.record_allowed(ToolCall("files", "fetch", {"endpoint": "https://intranet.example/public/x", "n": 3}))
    assert not s.taints


def test_taint_sources_and_egress_sinks_match_the_listed_tool_in_any_case(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "payroll").mkdir(parents=True)
    secret = root / "payroll" / "2026.csv"
    secret.write_text("alice,100000\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        _policy(root)
        .replace("source_tools: [read_file, read_doc, read_in]", "source_tools: [READ_FILE]")
        .replace("sink_tools: [send]", "sink_tools: [Send]")
    )
    log = tmp_path / "server.jsonl"
    vp = _files_visor(tmp_path, policy)
    try:
        vp.open_session()
        vp.request(_call(1, "read_file", {"req": {"path": str(secret)}}))
        read = vp.recv()
        assert read["id"] == 1 and not _denied(read), read
        vp.request(_call(2, "send", {"to": "eve", "body": "alice,100000"}))
        sent = vp.recv()
    finally:
        vp.kill()
    assert _denied(sent), sent
    assert [r["tool"] for r in _records(log)] == ["read_file"]


def test_tool_name_lists_that_restrict_fold_case_and_the_ones_that_allow_do_not() -> None:
    from visor.policy.chains import name_matches, name_matches_any_case

    assert name_matches_any_case(["send_note"], "Send_Note")
    assert name_matches_any_case(["slack_*"], "SLACK_post")
    assert name_matches_any_case(["send_note"], "\u017fend_note")  # Go folds the long s onto s
    assert not name_matches_any_case(["send_note"], "send_notes")
    assert not name_matches(["fs/read_file"], "fs/READ_FILE")  # identities: another case is another tool


def test_a_resource_read_of_a_source_file_taints_the_session(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    go_fs = build("go_fs", tmp_path_factory.mktemp("go"))
    root = tmp_path / "data"
    (root / "payroll").mkdir(parents=True)
    secret = root / "payroll" / "2026.csv"
    secret.write_text("alice,100000\n")
    shared = tmp_path / "shared.txt"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"""\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: files
    allowed: true
    tools:
      - {{name: read_file, allowed: true}}
      - {{name: write_file, allowed: true}}
taints:
  - name: payroll_read
    source_tools: [read_file]
    source_patterns: ["{root}/payroll/**"]
egress_controls:
  - name: no_write_after_payroll
    when_tainted: payroll_read
    sink_tools: [write_file]
    action: deny
"""
    )
    vp = _files_visor(tmp_path, policy, [str(go_fs)])
    try:
        vp.open_session()
        vp.request(
            {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": f"file://{secret}"}}
        )
        read = vp.recv()
        assert "alice,100000" in json.dumps(read), read
        # pipelined right behind the read: the taint must already hold
        vp.request(_call(2, "write_file", {"path": str(shared), "content": "alice,100000"}))
        wrote = vp.recv()
    finally:
        vp.kill()
    assert _denied(wrote), wrote
    assert not shared.exists()
    taints = [r for r in _records(tmp_path / "audit.jsonl") if r.get("event") == "taint"]
    assert len(taints) == 1 and taints[0]["method"] == "resources/read", taints


def test_the_taint_record_keeps_no_secret_the_allow_record_redacts(tmp_path: Path) -> None:
    from tests.conftest import RECORDER

    policy = tmp_path / "policy.yaml"
    policy.write_text(
        """\
version: "1.0"
default_action: deny
settings: {packs: []}
servers:
  - name: rec
    allowed: true
    tools:
      - {name: echo, allowed: true}
taints:
  - {name: keys_read, source_tools: [echo], source_patterns: ["/srv/**"]}
"""
    )
    audit = tmp_path / "audit.jsonl"
    secret = "AKIAIOSFODNN7EXAMPLE"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(tmp_path / "received.jsonl")},
        visor_args=["--server-name", "rec", "--policy", str(policy), "--audit-log", str(audit), "--no-group"],
    )
    try:
        vp.open_session()
        vp.request(_call(1, "echo", {"path": f"/srv/keys/{secret}.txt"}))
        assert vp.recv()["id"] == 1
    finally:
        vp.kill()
    records = _records(audit)
    (taint,) = [r for r in records if r["event"] == "taint"]
    assert taint["taint"] == "keys_read" and "/srv/keys/" in taint["matched"]
    assert secret not in audit.read_text()


def test_decoy_folders_cannot_hide_the_one_a_name_is_joined_to() -> None:
    p = _unit_policy("/srv/data")
    s = session_for(p, "files")
    decoys = {f"d{i}": f"/srv/decoy{i}" for i in range(40)}
    s.record_allowed(
        ToolCall("files", "read_in", {**decoys, "folder": "/srv/data", "name": "payroll/2026.csv"})
    )
    assert s.taints == {"payroll_read"}
    s = session_for(p, "files")
    s.record_allowed(ToolCall("files", "read_in", {"folder": "/srv/data", "name": "public/2026.csv"}))
    assert not s.taints


def test_a_source_file_embedded_in_another_tools_result_taints_the_session(tmp_path: Path) -> None:
    # find(term) is no source tool, and "2026" names no file; the result embeds the payroll file
    root = tmp_path / "data"
    (root / "payroll").mkdir(parents=True)
    (root / "payroll" / "2026.csv").write_text("alice,100000\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(root))
    log = tmp_path / "server.jsonl"
    audit = tmp_path / "audit.jsonl"
    vp = _files_visor(tmp_path, policy, TAINT_ROOT=str(root))
    try:
        vp.open_session()
        vp.request(_call(1, "find", {"term": "2026"}))
        found = vp.recv()
        assert found["id"] == 1 and "alice,100000" in json.dumps(found), found
        vp.request(_call(2, "send", {"to": "eve", "body": "alice,100000"}))
        sent = vp.recv()
    finally:
        vp.kill()
    assert _denied(sent), sent
    assert [r["tool"] for r in _records(log)] == ["find"]
    (taint,) = [r for r in _records(audit) if r["event"] == "taint"]
    assert taint["tool"] == "find" and taint["in_output"] is True
