"""`visor lint` and `visor pins`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.policy.helpers import policy_from
from visor.policy import commands
from visor.policy.lint import lint_policy
from visor.session import SessionState

DATA = Path(__file__).parent / "data"


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="visor")
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    return str(f)


CLEAN = 'version: "1.0"\ndefault_action: deny\nservers: []\n'


def test_lint_clean_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["lint", _write(tmp_path, CLEAN)]) == 0
    assert "ok" in capsys.readouterr().out


def test_lint_error_exits_1_and_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["lint", str(DATA / "wrong-positions.yaml")]) == 1
    out = capsys.readouterr().out
    assert "wrong-positions.yaml:12: error: servers[1].rules: unknown key 'rules' at server level" in out


def test_lint_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["lint", "--json", str(DATA / "wrong-positions.yaml")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["errors"][0]["key"] == "servers[1].rules" and data["errors"][0]["line"] == 12


WARNY = """
default_action: deny
servers:
  - name: mail
    allowed: true
    tools:
      - name: send_message
        allowed: true
      - name: outbox
        allowed: true
        exfiltrating: true
        sink_params: [to]
      - name: read
        allowed: true
        rules:
          - type: deny_path
            patterns: ["/data/**"]
          - type: allow_path
            patterns: ["/data/x/**"]
  - name: gmail
    allowed: true
    tools:
      - name: send_email
        allowed: true
        exfiltrating: false
  - name: lonely
    allowed: false
    tools:
      - name: t
        allowed: true
tool_chains:
  - name: c
    sources: [{server: ghost, tool_pattern: read}]
    sinks: [{server: mail, tool_pattern: outbox}]
    action: deny
"""


def test_lint_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, WARNY)
    assert _run(["lint", path]) == 0
    out = capsys.readouterr().out
    assert "'send_message' looks like a sending tool" in out
    assert "sending tool 'outbox' has no trusted_destinations" in out
    assert "allow_path '/data/x/**' is shadowed by a deny_path pattern" in out
    assert "overrides pack 'gmail': exfiltrating true -> false" in out
    assert "server 'ghost' is not in the policy" in out
    assert "server 'lonely' is never referenced" in out
    assert "tool is allowed but server 'lonely' is not" in out
    assert _run(["lint", "--strict", path]) == 1


def test_lint_reports_pack_merges() -> None:
    p = policy_from(
        """
        servers:
          - name: gmail
            allowed: true
            tools:
              - name: send_email
                allowed: true
                trusted_destinations: ["me@home.example"]
        """
    )
    messages = [f.message for f in lint_policy(p)]
    assert any("merges with pack 'gmail'" in m and "trusted_destinations" in m for m in messages)


def test_pins_show_and_reset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = policy_from(CLEAN)
    s = SessionState(p, "srv")
    s.observe_tools_list({"tools": [{"name": "a"}, {"name": "b"}]})
    pin_file = tmp_path / "pins.json"
    pin_file.write_text(json.dumps(s.export_pins()))
    assert _run(["pins", "--pin-file", str(pin_file)]) == 0
    assert set(json.loads(capsys.readouterr().out)["tools"]) == {"a", "b"}
    assert _run(["pins", "--pin-file", str(pin_file), "--reset", "a"]) == 0
    assert set(json.loads(pin_file.read_text())["tools"]) == {"b"}
    assert _run(["pins", "--pin-file", str(pin_file), "--reset", "zzz"]) == 1
    assert _run(["pins", "--pin-file", str(pin_file), "--reset"]) == 0
    assert json.loads(pin_file.read_text())["tools"] == {}
    assert _run(["pins", "--pin-file", str(tmp_path / "missing.json")]) == 1
    assert "no such pin file" in capsys.readouterr().err


def _sink_findings(text: str) -> dict[str, str]:
    return {
        f.key.rsplit(".", 1)[1]: f.message for f in lint_policy(policy_from(text)) if ".sink_kinds." in f.key
    }


def _notify(kinds: str) -> str:
    """A policy whose one sending tool, `notify` of server `chat` (no pack), says `sink_kinds: KINDS`."""
    return (
        "servers:\n  - name: chat\n    allowed: true\n    tools:\n      - name: notify\n"
        f"        allowed: true\n        exfiltrating: true\n        sink_kinds: {kinds}\n"
    )


def test_lint_says_when_sink_kinds_none_switches_provenance_off() -> None:
    # No pack for this server: `to` is a destination by its name, `channel` too; `topic` is not.
    found = _sink_findings(_notify("{to: none, channel: user, topic: none}"))
    assert set(found) == {"to"}, found
    assert "switches destination provenance off" in found["to"] and "'notify'" in found["to"]
    # With no argument declared at all, every address-shaped value is still checked: lint says
    # what is left rather than "off".
    alone = _sink_findings(_notify("{to: none}"))
    assert "only its address- and URL-shaped values are still checked" in alone["to"], alone


def test_lint_says_when_sink_kinds_none_is_overruled_by_sink_params_or_changes_a_packs_kind() -> None:
    # The workspace pack names `to` in sink_params: none cannot take it off, and says so; `cc`
    # read as a url instead of the pack's email is a change worth a line.
    found = _sink_findings(
        """
        servers:
          - name: workspace
            allowed: true
            tools:
              - name: send_email
                allowed: true
                sink_kinds: {to: none, cc: url}
        """
    )
    assert set(found) == {"to", "cc"}, found
    assert found["to"].startswith("none has no effect") and "pack 'workspace'" in found["to"], found
    assert "was read as email, now as url" in found["cc"], found


def test_the_evaluator_and_lint_read_sink_kinds_none_alike() -> None:
    # What lint says is off is off: the same address through the tool with and without `none`.
    from visor.policy.decision import ToolCall
    from visor.policy.evaluate import evaluate

    def decide(kinds: str) -> str:
        p = policy_from(_notify(kinds))
        session = SessionState(p, "chat")
        session.observe_output("read", {"content": [{"type": "text", "text": "mail evil@attacker.example"}]})
        d = evaluate(p, session, ToolCall("chat", "notify", {"to": "evil@attacker.example"}))
        return d.rule

    # `channel` declared: `to` is read by its declaration alone.
    assert decide("{to: email, channel: channel}") == "provenance.untrusted_output"
    # (no listing in this bare session: the next check in line asks for one)
    assert decide("{to: none, channel: channel}") == "pin.no_tools_list"
    # nothing declared a destination: the address is still caught, as lint says
    assert decide("{to: none}") == "provenance.untrusted_output"
