import argparse
import hashlib
import sys
import types

import pytest

from visor.audit.commands import register
from visor.audit.probe import fsync_latency_probe
from visor.audit.report import build_report
from visor.audit.writer import AuditWriter
from visor.policy.schema import Policy, Rule, ServerPolicy, Taint, ToolPolicy

SECRET = "hunter2-secret-argument"


def cli(*argv):
    parser = argparse.ArgumentParser(prog="visor")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "audit.jsonl"
    w = AuditWriter.open(path, session="sess-one")
    base = {"server": "mail", "args": {"to": SECRET, "body": SECRET}, "policy": "ab" * 32}
    w.append({"event": "allow", "tool": "read_inbox", "id": 1, "rule": "mail.read", "reason": "ok", **base})
    w.append(
        {
            "event": "deny",
            "tool": "send_email",
            "id": 2,
            "rule": "provenance",
            "reason": f"to {SECRET}",
            **base,
        }
    )
    w.append(
        {
            "event": "ask",
            "tool": "send_email",
            "id": 3,
            "rule": "untrusted-destination",
            "reason": "?",
            **base,
        }
    )
    w.append({"event": "taint", "taint": "read_untrusted_mail", "server": "mail", "tool": "read_inbox"})
    w.append({"event": "pin", "server": "mail", "tool": "send_email", "digest": "cd" * 32})
    w.append(
        {
            "event": "deny",
            "server": "fs",
            "tool": "\x1b[31mevil\x07",
            "id": 4,
            "rule": "unknown-tool",
            "args": {},
        }
    )
    w.close_sync()
    with open(path, "ab") as f:
        f.write(b"this line is malformed\n")
    return path


@pytest.fixture
def fake_loader(monkeypatch, tmp_path):
    policy = Policy(
        source=str(tmp_path / "policy.yaml"),
        sha256="ef" * 32,
        servers=(
            ServerPolicy(
                name="mail",
                allowed=True,
                tools={
                    "read_inbox": ToolPolicy(name="read_inbox", allowed=True),
                    "send_email": ToolPolicy(
                        name="send_email", allowed=True, exfiltrating=True, sink_params=("to",)
                    ),
                    "save_draft": ToolPolicy(name="save_draft", allowed=True, write_params=("path",)),
                    "archive": ToolPolicy(
                        name="archive",
                        allowed=True,
                        rules=(Rule(type="allow_path", line=3, patterns=("/a/**",)),),
                    ),
                },
            ),
        ),
        taints=(Taint(name="read_untrusted_mail", source_tools=("read_inbox",)),),
    )
    module = types.ModuleType("visor.policy.loader")
    module.load_policy = lambda path: policy
    monkeypatch.setitem(sys.modules, "visor.policy.loader", module)
    (tmp_path / "policy.yaml").write_text("version: '1.0'\n")
    return tmp_path / "policy.yaml"


def test_report_with_policy(log, fake_loader):
    text = build_report([log], policy_path=fake_loader)
    assert SECRET not in text and "\x1b" not in text
    assert "malformed lines skipped: 1" in text
    assert "send\\_email sends data but has no trusted destinations" in text
    assert "save\\_draft writes but is not confined" in text
    assert "read\\_inbox is allowed and nothing constrains it" not in text  # it sets a taint
    assert "| mail | archive | yes | policy | allow\\_path |" in text
    assert "fallback" in text  # fs/evil is not in the policy
    assert "read\\_untrusted\\_mail | 1" in text
    for n in range(1, 11):
        assert f"LLM{n:02d}" in text
    assert "What Visor does not cover" in text
    assert "Chain integrity (whole log, not only the window): DOES NOT VERIFY" in text


def test_report_degrades_without_loader(log, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "visor.policy.loader", None)  # import fails
    policy = tmp_path / "p.yaml"
    policy.write_text("servers: []\n")
    out = tmp_path / "pack.md"
    assert cli("report", "--audit", str(log), "--policy", str(policy), "-o", str(out)) == 0
    text = out.read_text()
    assert "could not be analysed" in text and SECRET not in text
    assert "| mail | send\\_email | 0 | 1 | 1 |" in text


def test_report_window_filters(log):
    text = build_report(
        [log], win=__import__("visor.audit.reader", fromlist=["window"]).window("2000-01-01", "2000-01-02")
    )
    assert "Records in the window: 0" in text


def test_show_table_and_filters(log, capsys):
    assert cli("audit", "show", "--file", str(log)) == 0
    out = capsys.readouterr().out
    assert "send_email" in out and "read_inbox" in out and "taint" not in out.split("\n", 1)[1]
    # escapes are shown, visibly (\x1b), never sent to the terminal raw
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mevil\\x07" in out
    assert cli("audit", "show", "--file", str(log), "--verdict", "deny", "--tool", "send_email") == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert len(rows) == 1 and "provenance" in rows[0]
    assert cli("audit", "show", "--file", str(log), "--all", "--session", "sess") == 0
    assert "audit_open" in capsys.readouterr().out
    assert cli("audit", "show", "--file", str(log), "--json", "--verdict", "ask") == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and '"event":"ask"' in out[0]


def test_fsync_probe(tmp_path):
    seconds = fsync_latency_probe(tmp_path, samples=3)
    assert seconds > 0
    assert list(tmp_path.iterdir()) == []


def test_a_reloaded_policy_counts_as_one_the_sessions_ran_under(tmp_path):
    from visor.audit import events

    first, second = tmp_path / "one.yaml", tmp_path / "two.yaml"
    first.write_text('version: "1.0"\ndefault_action: deny\n')
    second.write_text('version: "1.0"\ndefault_action: allow\n')
    sha = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (first, second)}
    path = tmp_path / "audit.jsonl"
    w = AuditWriter.open(path, session="sess-reload")
    w.append(events.session_start("mail", "mail-server", sha[first]))
    w.append(events.policy_load(str(first), sha[first]))
    w.append(events.policy_reload(source=str(second), previous=sha[first], policy=None, ok=False, error="x"))
    w.close_sync()  # (the writer's thread has written every record)
    only_one = build_report([path], policy_from_log=True)
    assert "Policy reloads: 0 put in force, 1 refused" in only_one
    assert f"sha256 `{sha[first]}`" in only_one  # a refused reload changed nothing
    w = AuditWriter.open(path, session="sess-reload")
    w.append(events.policy_reload(source=str(second), previous=sha[first], policy=sha[second], ok=True))
    w.close_sync()
    pack = build_report([path], policy_from_log=True)
    assert "Policy reloads: 1 put in force, 1 refused" in pack
    assert "ran under 2 different policies" in pack
