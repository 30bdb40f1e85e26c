"""Data in and out beyond the tools/call verdict: redaction, resources, prompts, server requests.

`DataGuard` is what `PolicyChecks` delegates to for everything that is not
the policy decision on a tool call. Its checks are synchronous and its only
side effect is emitting audit records (and the stderr line of a deny) as
actions; the decisions themselves are the pure functions of
visor/policy/requests.py.

Error codes Visor answers with (docs/policy.md, "Beyond tools/call"):

* a denied ``resources/read``, ``resources/subscribe`` or ``prompts/get``:
  -32602 (invalid params). MCP already answers an unknown resource with
  -32002 ("resource not found"); a denial is not that, and a client that
  retries on "not found" must not retry a denial. ``error.data.visor`` holds
  the rule.
* a denied ``sampling/createMessage`` or ``elicitation/create`` from the
  server: -32600 (invalid request), sent back to the server; the client never
  sees the request. So is an elicitation that speaks as Visor; every other one
  reaches the client with its message marked as the server's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from visor import redact
from visor.approval.elicitation import server_question
from visor.audit import events
from visor.core.events import Action, Announce, AppendRecord

# Re-exported: the core and PolicyChecks name them from here.
from visor.core.passthrough import Refuse as Refuse
from visor.core.passthrough import RequestVerdict as RequestVerdict
from visor.core.passthrough import Rewrite as Rewrite
from visor.logs import get_logger
from visor.policy.requests import (
    SERVER_REQUEST_KEYS,
    elicitation_decision,
    prompt_arguments_decision,
    prompt_decision,
    resource_decision,
    sampling_tools_decision,
    server_request_decision,
    statically_denied,
)
from visor.wire import errors

if TYPE_CHECKING:
    from visor.policy.evaluate import Decision
    from visor.policy.schema import Policy
    from visor.session import SessionState
    from visor.wire.message import Message

# The stderr lines of these denials keep the name they always had.
LOGGER = "visor.gating"
log = get_logger(LOGGER)

DENIED_REQUEST = errors.INVALID_PARAMS
DENIED_SERVER_REQUEST = errors.INVALID_REQUEST


def _rewrite(obj: dict[str, Any], key: str, value: Any) -> bytes:
    """The message with one top-level member replaced; every other field kept as parsed.

    orjson writes integers exactly (ids above 2**53 stay integers) and compactly, on one line.
    """
    out = dict(obj)
    out[key] = value
    return orjson.dumps(out)


class DataGuard:
    """Per-session: the compiled redactor, the tools' output schemas, where records go."""

    def __init__(self, policy: Policy, server: str, emit: Callable[[Action], None]) -> None:
        self.policy = policy
        self.server = server
        self._emit = emit
        engine = policy.redaction.engine
        self.redactor: redact.Redactor = engine if engine is not None else redact.DEFAULT_REDACTOR
        self.max_output = policy.settings.max_output_size_bytes
        self.output_schemas: dict[str, Any] = {}

    def rebind(self, policy: Policy) -> None:
        """Judge with `policy` from now on (a reload); the output schemas the server listed stay."""
        self.policy = policy
        engine = policy.redaction.engine
        self.redactor = engine if engine is not None else redact.DEFAULT_REDACTOR
        self.max_output = policy.settings.max_output_size_bytes

    # ------------------------------------------------------------ evidence
    def evidence(self, text: str) -> str:
        """`text` redacted as arguments are: a name the model chose (a tool, a resource's URI, a
        prompt) or a reason quoting one goes where the arguments go, the log, stderr and telemetry."""
        return self.redactor.arguments.redact_text(text)[0]

    def _redacted(self, direction: str, msg_id: Any, findings: list[redact.Finding], **detail: Any) -> None:
        detail = {k: self.evidence(v) if type(v) is str else v for k, v in detail.items()}
        self._emit(
            AppendRecord(
                events.redaction(
                    server=self.server,
                    direction=direction,
                    request_id=msg_id,
                    fields=[f.as_json() for f in findings],
                    **detail,
                )
            )
        )

    def _denied(self, decision: Decision, msg: Message, **detail: Any) -> None:
        event = events.request_verdict(
            "deny",
            server=self.server,
            method=self.evidence(msg.method) if msg.method else None,
            request_id=msg.id,
            rule=decision.rule,
            reason=self.evidence(decision.reason),
            policy=self.policy.sha256,
            **{k: self.evidence(v) if type(v) is str else v for k, v in detail.items()},
        )
        self._emit(AppendRecord(event))
        # the same one line on stderr as a denied tool call (resources, prompts, server requests)
        self._emit(Announce(event, LOGGER))

    # ---------------------------------------------------------- tools/call
    def redact_call(self, msg: Message) -> Message:
        """The call with secrets in its arguments replaced (raw, obj and arguments), or `msg` itself.

        Called after the policy has evaluated the original arguments; the
        server and the audit log see only the redacted ones.
        """
        pset = self.redactor.arguments
        if msg.arguments is None or not pset.may_match(msg.raw):
            return msg
        # The model names the tool as freely as it writes the arguments: the records, the stderr
        # line and the spans read the name from here. The server still gets the real one (raw).
        tool = msg.tool if msg.tool is None else pset.redact_text(msg.tool)[0]
        new_args, findings = redact.redact_arguments(pset, msg.arguments)
        if not findings:
            return msg if tool == msg.tool else msg._replace(tool=tool)
        params = {**(msg.obj.get("params") or {}), "arguments": new_args}
        raw = _rewrite(msg.obj, "params", params)
        self._redacted("arguments", msg.id, findings, tool=tool, method=msg.method)
        return msg._replace(raw=raw, obj=orjson.loads(raw), arguments=new_args, tool=tool)

    def tool_result(self, tool: str | None, response: Message) -> bytes | None:
        result = response.obj.get("result")
        if type(result) is not dict:
            # An error answers the call: its message and data are the server's text too.
            return self.server_output(response, "error", tool=tool, method="tools/call")
        new = result
        findings: list[redact.Finding] = []
        notes: dict[str, Any] = {}
        pset = self.redactor.outputs
        if pset.may_match(response.raw):
            new = redact.redact_output(result, pset, "$", findings)
            if "structuredContent" in new and new.get("structuredContent") is not result.get(
                "structuredContent"
            ):
                new = self._keep_schema(tool, new, notes)
        limit = self.max_output
        if limit is not None and len(response.raw) > limit:
            new, kept, total = redact.truncate_content(new, limit)
            if kept != total:
                notes["truncated"] = {"kept_bytes": kept, "total_bytes": total}
        if new is result:
            return None
        if findings:
            self._redacted("output", response.id, findings, tool=tool, method="tools/call", **notes)
        elif notes:
            event = events.redaction(
                server=self.server, direction="output", request_id=response.id, fields=[], **notes
            )
            # this record has always named the tool and method, even a tool of None
            event.update(tool=tool, method="tools/call")
            self._emit(AppendRecord(event))
        return _rewrite(response.obj, "result", new)

    def _keep_schema(self, tool: str | None, result: dict[str, Any], notes: dict[str, Any]) -> dict[str, Any]:
        """Redacted structured content that its outputSchema would refuse is withheld.

        Redaction only replaces text inside strings, so types and shape never
        change; but a replacement can break a ``pattern``, ``maxLength``,
        ``enum`` or ``const`` on that string. Sending it would make the
        client reject the whole result, and sending the secret is not an
        option: the result becomes a tool error (``isError`` results are not
        validated against the schema) that keeps the redacted text content and
        says why.
        """
        schema = self.output_schemas.get(tool) if tool is not None else None
        if type(schema) is not dict:
            return result
        conflicts = redact.schema_conflicts(result["structuredContent"], schema)
        if not conflicts:
            return result
        notes["withheld_structured_content"] = conflicts
        out = {k: v for k, v in result.items() if k != "structuredContent"}
        content = list(out.get("content") or []) if type(out.get("content")) is list else []
        content.append(
            {
                "type": "text",
                "text": "[Visor: structured output withheld: a redacted secret would not satisfy the "
                f"tool's outputSchema at {', '.join(conflicts)}]",
            }
        )
        out["content"] = content
        out["isError"] = True
        return out

    def observe_tools_list(self, result: dict[str, Any]) -> None:
        tools = result.get("tools")
        if type(tools) is not list:
            return
        for t in tools:
            if type(t) is dict and type(t.get("name")) is str:
                self.output_schemas[t["name"]] = t.get("outputSchema")

    def hide_tools(self, session: SessionState, response: Message) -> bytes | None:
        """The tools/list answer without the tools the policy forbids outright (if the server asks for it)."""
        entry = self.policy.server(self.server)
        if entry is None or not entry.hide_denied_tools:
            return None
        result = response.obj.get("result")
        if not isinstance(result, dict):
            return None
        tools = result.get("tools")
        if type(tools) is not list:
            return None
        kept = [
            t
            for t in tools
            if not (
                type(t) is dict
                and type(t.get("name")) is str
                and statically_denied(self.policy, session, t["name"])
            )
        ]
        if len(kept) == len(tools):
            return None
        return _rewrite(response.obj, "result", {**result, "tools": kept})

    # ------------------------------------------- resources, prompts, sampling
    def client_request(self, msg: Message) -> RequestVerdict:
        """For a gated client request: `Refuse` (denied), `Rewrite` (arguments redacted),
        or None (forward unchanged)."""
        params = msg.obj.get("params")
        params = params if type(params) is dict else {}
        if msg.method in ("resources/read", "resources/subscribe"):
            uri = params.get("uri")
            if type(uri) is not str:
                return None  # the server answers a malformed request itself
            decision = resource_decision(self.policy, self.server, uri)
            if decision is not None:
                self._denied(decision, msg, uri=uri)
                return Refuse(self._error(msg, decision))
            return None
        if msg.method == "prompts/get":
            name = params.get("name")
            if type(name) is not str:
                return None
            decision = prompt_decision(self.policy, self.server, name)
            args = params.get("arguments")
            if decision is None and type(args) is dict:
                decision = prompt_arguments_decision(self.policy, args)
            if decision is not None:
                self._denied(decision, msg, prompt=name)
                return Refuse(self._error(msg, decision))
            pset = self.redactor.arguments
            if type(args) is dict and pset.may_match(msg.raw):
                new_args, findings = redact.redact_arguments(pset, args)
                if findings:
                    self._redacted("arguments", msg.id, findings, method=msg.method, prompt=name)
                    return Rewrite(_rewrite(msg.obj, "params", {**params, "arguments": new_args}))
        return None

    def _error(self, msg: Message, decision: Decision) -> bytes:
        return errors.error_response(
            msg.id,
            DENIED_REQUEST,
            f"Visor denied {msg.method}: {decision.reason} (rule: {decision.rule})",
            {"visor": {"rule": decision.rule}},
        )

    def response(self, method: str, response: Message) -> bytes | None:
        """Any answer but a tool call's, with secrets in its result (or error) redacted."""
        key = "result" if "result" in response.obj else "error"
        return self.server_output(response, key, method=method)

    def redact_server_request(self, msg: Message) -> bytes | None:
        """A sampling/createMessage or elicitation/create with secrets in its text redacted, and
        an elicitation's message marked as the server's (`server_request` refused any other)."""
        line = self.server_output(msg, "params", direction="server_request", method=msg.method)
        if msg.method != "elicitation/create":
            return line
        obj = msg.obj if line is None else orjson.loads(line)
        params = obj["params"]
        marked = {**params, "message": server_question(self.server, params["message"])}
        return _rewrite(obj, "params", marked)

    def notification(self, msg: Message) -> bytes | None:
        """A server's notification (progress, log message, ...) with secrets in its text redacted."""
        return self.server_output(msg, "params", direction="notification", method=msg.method)

    def input_requests(
        self, method: str, response: Message, *, modern: bool = True
    ) -> Message | bytes | None:
        """An ``input_required`` answer (2026-07-28) carries the server's elicitation and sampling
        requests inside it (``inputRequests``), in place of requests of their own: each is judged, recorded and marked
        as a standalone one is. Returns the answer with them marked, the error the client gets
        instead when one is refused, or None (no such answer)."""
        result = response.obj.get("result")
        # Whatever the answer's resultType or method: the tasks extension carries the same map
        # in a task's status, and a client shows what it finds there.
        embedded = result.get("inputRequests") if type(result) is dict else None
        if type(result) is not dict or type(embedded) is not dict:
            return None  # only requestState: nothing for the client to show anyone
        marked: dict[str, Any] = {}
        for key, request in embedded.items():
            inner = request.get("method") if type(request) is dict else None
            if type(inner) is not str:
                marked[key] = request
                continue
            params = request.get("params")
            decision = self._server_request_decision(inner, params, response.id, input_request=key)
            if decision is not None:
                event = events.request_verdict(
                    "deny",
                    server=self.server,
                    method=inner,
                    request_id=response.id,
                    rule=decision.rule,
                    reason=decision.reason,
                    policy=self.policy.sha256,
                    direction="server",
                    input_request=key,
                )
                self._emit(AppendRecord(event))
                self._emit(Announce(event, LOGGER))
                text = f"Visor denied the server's {inner}: {decision.reason} (rule: {decision.rule})"
                if method == "tools/call":
                    return errors.tool_error_result(response.id, text, modern=modern)
                return errors.error_response(response.id, DENIED_SERVER_REQUEST, text)
            if inner == "elicitation/create":
                request = {
                    **request,
                    "params": {**params, "message": server_question(self.server, params["message"])},
                }
            marked[key] = request
        raw = _rewrite(response.obj, "result", {**result, "inputRequests": marked})
        return response._replace(raw=raw, obj=orjson.loads(raw))

    def server_output(
        self, msg: Message, key: str, *, direction: str = "output", **detail: Any
    ) -> bytes | None:
        """`msg` with secrets in its member `key` redacted, or None when there were none."""
        value = msg.obj.get(key)
        pset = self.redactor.outputs
        if type(value) is not dict or not pset.may_match(msg.raw):
            return None
        findings: list[redact.Finding] = []
        new = redact.redact_output(value, pset, f"$.{key}", findings)
        if not findings:
            return None
        self._redacted(direction, msg.id, findings, **detail)
        return _rewrite(msg.obj, key, new)

    def _server_request_decision(
        self, method: str, params: Any, request_id: Any, **detail: Any
    ) -> Decision | None:
        """A server's request to the client judged, and its allow recorded; the deny is the caller's."""
        decision = server_request_decision(self.policy, self.server, method)
        if decision is None and method == "elicitation/create":
            decision = elicitation_decision(params)
        if decision is None and method == "sampling/createMessage":
            decision = sampling_tools_decision(self.policy, self.server, params)
        if decision is None and method in SERVER_REQUEST_KEYS:
            event = events.request_verdict(
                "allow",
                server=self.server,
                method=method,
                request_id=request_id,
                rule="server_requests.default",
                reason=f"{method} is allowed from this server",
                policy=self.policy.sha256,
                direction="server",
                **detail,
            )
            self._emit(AppendRecord(event))
        return decision

    def server_request(self, msg: Message) -> bytes | None:
        """An error line to send back to the server when its request is refused, else None."""
        assert msg.method is not None
        decision = self._server_request_decision(msg.method, msg.obj.get("params"), msg.id)
        if decision is None:
            return None
        self._denied(decision, msg, direction="server")
        return errors.error_response(
            msg.id,
            DENIED_SERVER_REQUEST,
            f"Visor denied {msg.method}: {decision.reason} (rule: {decision.rule})",
        )
