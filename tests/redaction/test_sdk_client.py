"""The real SDK client validates redacted structured content against the tool's outputSchema."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp import ClientSession, stdio_client

from tests.integration.sdk_scenario import visor_params

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "sdk_secrets.py")]
POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "secrets"
    allowed: true
    tools:
      - {name: creds, allowed: true}
"""


def test_sdk_client_accepts_redacted_structured_content(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    audit = tmp_path / "audit.jsonl"
    params = visor_params(
        SERVER, ["--server-name", "secrets", "--policy", str(policy), "--audit-log", str(audit)]
    )

    async def scenario() -> tuple[object, object]:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.list_tools()
            # call_tool validates structuredContent against outputSchema and raises if it fails.
            result = await s.call_tool("creds", {"user": "me"})
            resource = await s.read_resource("memo://config")
            return result, resource

    result, resource = anyio.run(scenario)
    assert not result.is_error  # type: ignore[attr-defined]
    sc = result.structured_content  # type: ignore[attr-defined]
    assert sc["token"] == "[REDACTED:github_token]"
    assert sc["port"] == 5432
    assert sc["urls"] == ["postgres://app:[REDACTED:password]@db/x", "https://ok.example"]
    assert "ghp_" not in result.content[0].text  # type: ignore[attr-defined]
    assert resource.contents[0].text == "TOKEN=[REDACTED:github_token]\n"  # type: ignore[attr-defined]
    data = audit.read_bytes()
    assert b"ghp_" not in data and b"hunter2" not in data
