"""A stdio MCP server exposing AgentDojo's workspace tools over one task's environment.

    python -m visor.eval.workspace_server --state ENV.json --out OUT.json

ENV.json is a `WorkspaceEnvironment` as JSON (the harness loads it with AgentDojo,
injections filled in, and dumps it). Each AgentDojo workspace function is a tool
with the function's own JSON schema and description; a call runs the function
with AgentDojo's `FunctionsRuntime` and returns its result formatted as AgentDojo
formats tool results for a model (YAML text, `tool_result_to_str`). After every
call the environment and the list of calls that ran are written to OUT.json
(atomically), so the harness scores exactly the state the calls left behind.

Raw newline-delimited JSON-RPC, no MCP SDK: the server starts in a few hundred
milliseconds, and it imports only the workspace tool modules of AgentDojo (not
its model clients).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import yaml
from agentdojo.default_suites.v1.tools.calendar_client import (
    Calendar,
    CalendarEvent,
    add_calendar_event_participants,
    cancel_calendar_event,
    create_calendar_event,
    get_current_day,
    get_day_calendar_events,
    reschedule_calendar_event,
    search_calendar_events,
)
from agentdojo.default_suites.v1.tools.cloud_drive_client import (
    CloudDrive,
    CloudDriveFile,
    append_to_file,
    create_file,
    delete_file,
    get_file_by_id,
    list_files,
    search_files,
    search_files_by_filename,
    share_file,
)
from agentdojo.default_suites.v1.tools.email_client import (
    Email,
    EmailContact,
    Inbox,
    delete_email,
    get_draft_emails,
    get_received_emails,
    get_sent_emails,
    get_unread_emails,
    search_contacts_by_email,
    search_contacts_by_name,
    search_emails,
    send_email,
)
from agentdojo.functions_runtime import FunctionsRuntime, TaskEnvironment, make_function
from pydantic import BaseModel

SERVER_NAME = "agentdojo-workspace"

# The same functions, in the same order, as AgentDojo's workspace suite
# (agentdojo/default_suites/v1/workspace/task_suite.py, TOOLS). The harness
# checks the names against the loaded suite before it runs anything.
TOOLS = [
    send_email,
    delete_email,
    get_unread_emails,
    get_sent_emails,
    get_received_emails,
    get_draft_emails,
    search_emails,
    search_contacts_by_name,
    search_contacts_by_email,
    get_current_day,
    search_calendar_events,
    get_day_calendar_events,
    create_calendar_event,
    cancel_calendar_event,
    reschedule_calendar_event,
    add_calendar_event_participants,
    append_to_file,
    search_files_by_filename,
    create_file,
    delete_file,
    get_file_by_id,
    list_files,
    share_file,
    search_files,
]


class WorkspaceEnv(TaskEnvironment):  # type: ignore[misc]  # agentdojo ships no type information
    """Field for field AgentDojo's `WorkspaceEnvironment` (which lives in a module that loads the whole suite)."""

    inbox: Inbox
    calendar: Calendar
    cloud_drive: CloudDrive


def restore_environment(cls: type[Any], data: dict[str, Any]) -> Any:
    """An environment from its `model_dump` (JSON), with its live state.

    AgentDojo's models rebuild `emails`, `events` and `files` from their
    `initial_*` lists when validated (and extend `contact_list`), which would
    undo every call; the dumped live dictionaries are put back after validation.
    """
    env = cls.model_validate(data)
    inbox, calendar, drive = data["inbox"], data["calendar"], data["cloud_drive"]
    env.inbox.emails = {k: Email.model_validate(v) for k, v in inbox["emails"].items()}
    env.inbox.trash = {k: Email.model_validate(v) for k, v in inbox["trash"].items()}
    env.inbox.contact_list = [EmailContact.model_validate(v) for v in inbox["contact_list"]]
    env.calendar.events = {k: CalendarEvent.model_validate(v) for k, v in calendar["events"].items()}
    env.cloud_drive.files = {k: CloudDriveFile.model_validate(v) for k, v in drive["files"].items()}
    return env


def tool_result_to_str(tool_result: Any) -> str:
    """AgentDojo's default tool-output formatter (agent_pipeline/tool_execution.py), YAML via yaml.safe_dump."""
    if isinstance(tool_result, BaseModel):
        return yaml.safe_dump(tool_result.model_dump()).strip()
    if isinstance(tool_result, list):
        items: list[Any] = []
        for item in tool_result:
            if type(item) in (str, int):
                items.append(str(item))
            elif isinstance(item, BaseModel):
                items.append(item.model_dump())
            else:
                raise TypeError("Not valid type for item tool result: " + str(type(item)))
        return yaml.safe_dump(items).strip()
    return str(tool_result)


def tool_definitions(runtime: FunctionsRuntime) -> list[dict[str, Any]]:
    return [
        {"name": f.name, "description": f.description, "inputSchema": f.parameters.model_json_schema()}
        for f in runtime.functions.values()
    ]


class Server:
    def __init__(self, state: str, out: str) -> None:
        with open(state, encoding="utf-8") as fh:
            self.env = restore_environment(WorkspaceEnv, json.load(fh))
        self.out = out
        self.runtime = FunctionsRuntime([make_function(t) for t in TOOLS])
        self.calls: list[dict[str, Any]] = []
        self._save()

    def _save(self) -> None:
        tmp = f"{self.out}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write('{"calls":')
            fh.write(json.dumps(self.calls))
            fh.write(',"env":')
            fh.write(self.env.model_dump_json())
            fh.write("}")
        os.replace(tmp, self.out)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result, error = self.runtime.run_function(self.env, name, arguments)
        self.calls.append({"function": name, "args": arguments, "error": error})
        self._save()
        if error is not None:
            return {"content": [{"type": "text", "text": error}], "isError": True}
        return {"content": [{"type": "text", "text": tool_result_to_str(result)}], "isError": False}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        method = msg.get("method")
        if "id" not in msg:
            return None  # notifications (initialized, cancelled): nothing to answer
        mid = msg["id"]
        params = msg.get("params") or {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": "1.2.2"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": tool_definitions(self.runtime)}
        elif method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments") or {}
            if not isinstance(name, str) or name not in self.runtime.functions:
                return {
                    "jsonrpc": "2.0",
                    "id": mid,
                    "error": {"code": -32602, "message": f"unknown tool {name!r}"},
                }
            result = self.call(name, arguments)
        else:
            return {
                "jsonrpc": "2.0",
                "id": mid,
                "error": {"code": -32601, "message": f"method not found: {method}"},
            }
        return {"jsonrpc": "2.0", "id": mid, "result": result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", required=True, help="the task's environment as JSON")
    ap.add_argument(
        "--out", required=True, help="where to write the environment and the calls after each call"
    )
    args = ap.parse_args(argv)
    server = Server(args.state, args.out)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "method" not in msg:
            continue  # responses to requests this server never sends
        answer = server.handle(msg)
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
