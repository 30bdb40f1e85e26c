"""Path rules judge a relative name from every directory the server reads it from.

The npm filesystem server resolves a relative name against its allowed directories (its command
line's, or the client's roots); Visor read it only from the working directory. With the home
directory allowed and the session started in a project below it, ``secret/plan.txt`` was
``~/project/secret/plan.txt`` to the policy (inside ``allowed_path_prefixes``, outside every
``deny_path``) and ``~/secret/plan.txt`` to the server, which read it. Through a real ``visor
run`` in front of the real server: the direct run shows the server's reading, Visor denies it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import VisorProcess

NODE = Path(__file__).parents[2] / ".venv" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
SECRET = "the-launch-date"

POLICY = """\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: "filesystem"
    allowed: true
    tools:
      - name: "read_text_file"
        allowed: true
        {rule}
"""
PREFIX = 'allowed_path_prefixes: ["{project}"]'
DENY = 'rules: [{{type: deny_path, patterns: ["{home}/secret/**"]}}]'


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    if not NODE.exists():
        pytest.fail("the npm filesystem server is not installed; `make test` installs it")
    home = tmp_path / "home"
    (home / "secret").mkdir(parents=True)
    (home / "secret" / "plan.txt").write_text(SECRET)
    project = home / "project"
    project.mkdir()
    (project / "readme.txt").write_text("hello")
    return home, project


def _process(tmp_path: Path, home: Path, project: Path, policy: str | None) -> VisorProcess:
    visor_args = ["--server-name", "filesystem", "--audit-log", str(tmp_path / "audit.jsonl")]
    if policy is not None:
        path = tmp_path / "policy.yaml"
        path.write_text(policy)
        visor_args += ["--policy", str(path)]
    return VisorProcess([str(NODE), str(home)], visor_args=visor_args, env={"HOME": str(home)}, cwd=project)


def _read(vp: VisorProcess, msg_id: int, path: str) -> dict:
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "tools/call",
            "params": {"name": "read_text_file", "arguments": {"path": path}},
        }
    )
    while True:
        msg = vp.recv()
        if msg.get("id") == msg_id and "method" not in msg:
            return msg["result"]


def test_the_server_reads_a_relative_name_from_its_allowed_directory(tmp_path: Path) -> None:
    home, project = _dirs(tmp_path)
    # Visor with no policy file (its default allows reads inside the working tree): what the server does
    vp = _process(tmp_path, home, project, None)
    try:
        vp.open_session("2025-06-18")
        result = _read(vp, 1, "secret/plan.txt")
    finally:
        vp.kill()
    assert not (project / "secret").exists()
    assert result["content"][0]["text"] == SECRET, result


@pytest.mark.parametrize("rule", [PREFIX, DENY], ids=["allowed_path_prefixes", "deny_path"])
def test_a_relative_name_is_judged_where_the_server_reads_it(tmp_path: Path, rule: str) -> None:
    home, project = _dirs(tmp_path)
    vp = _process(tmp_path, home, project, POLICY.format(rule=rule.format(project=project, home=home)))
    try:
        vp.open_session("2025-06-18")
        denied = _read(vp, 1, "secret/plan.txt")
        assert denied["isError"] is True and "Visor denied" in denied["content"][0]["text"], denied
        assert SECRET not in str(denied)
        ok = _read(vp, 2, str(project / "readme.txt"))
        assert ok["content"][0]["text"] == "hello", ok
    finally:
        vp.kill()


def test_a_relative_source_read_taints_from_the_servers_directories(tmp_path: Path) -> None:
    from tests.policy.helpers import policy_from
    from visor.policy import chains

    policy = policy_from(
        f"""
version: "1.0"
default_action: allow
servers: [{{name: files, allowed: true}}]
taints:
  - name: "secret_read"
    source_tools: ["read_text_file"]
    source_patterns: ["{tmp_path}/home/secret/**"]
"""
    )
    args = {"path": "secret/plan.txt"}
    assert chains.taints_set_by(policy.taints, "files", "read_text_file", args) == []
    hits = chains.taints_set_by(policy.taints, "files", "read_text_file", args, (str(tmp_path / "home"),))
    assert [t.name for t, _ in hits] == ["secret_read"]
