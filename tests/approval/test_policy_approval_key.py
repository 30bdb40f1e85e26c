"""The `approval:` tool key: loaded, validated with file/line/key, merged stricter-wins, linted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.approval.raw_client import POLICY
from visor.policy.effective import merge_tool
from visor.policy.lint import lint_policy
from visor.policy.loader import PolicyError, load_policy, load_policy_text
from visor.policy.schema import ToolPolicy


def test_the_key_loads() -> None:
    policy = load_policy_text(POLICY.format(timeout=5, echo_extra="        approval: out_of_band"))
    (srv,) = policy.servers
    assert srv.tools["echo"].approval == "out_of_band" and srv.tools["send_email"].approval is None


def test_a_bad_value_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(timeout=5, echo_extra="        approval: client"))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    text = str(err.value)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "approval: client" in t)
    assert str(path) in text and f":{line}" in text and "approval" in text and "out_of_band" in text


@pytest.mark.parametrize(
    ("base", "over", "merged"),
    [
        (None, None, None),
        ("out_of_band", None, "out_of_band"),
        ("out_of_band", "any", "out_of_band"),  # a later entry cannot loosen it
        ("any", "out_of_band", "out_of_band"),
        ("any", None, "any"),
    ],
)
def test_merge_keeps_the_stricter(base: str | None, over: str | None, merged: str | None) -> None:
    out = merge_tool(ToolPolicy(name="t", approval=base), ToolPolicy(name="t", approval=over))
    assert out.approval == merged


def test_lint_warns_when_the_tool_is_not_allowed() -> None:
    text = POLICY.format(timeout=5, echo_extra="        approval: out_of_band").replace(
        'name: "echo"\n        allowed: true', 'name: "echo"\n        allowed: false'
    )
    findings = lint_policy(load_policy_text(text))
    assert any(f.key.endswith(".approval") for f in findings)
