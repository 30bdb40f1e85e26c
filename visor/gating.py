"""Data in and out beyond the tools/call verdict: redaction, resources, prompts, server requests.

`DataGuard` is what `PolicyGate` delegates to for everything that is not
the policy decision on a tool call. Its checks are synchronous and its only
side effect is appending audit events through the callback it is given; the
decisions themselves are the pure functions at the top of this module.

Error codes Visor answers with (docs/policy.md, "Beyond tools/call"):

* a denied ``resources/read``, ``resources/subscribe`` or ``prompts/get``:
  -32602 (invalid params). MCP already answers an unknown resource with
  -32002 ("resource not found"); a denial is not that, and a client that
  retries on "not found" must not retry a denial. ``error.data.visor`` holds
  the rule.
* a denied ``sampling/createMessage`` or ``elicitation/create`` from the
  server: -32600 (invalid request), sent back to the server; the client never
  sees the request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from visor import redact
from visor.logs import get_logger
from visor.policy import paths, readings
from visor.wire import errors

if TYPE_CHECKING:
    from visor.policy.evaluate import Decision
    from visor.policy.schema import AccessList, Policy
    from visor.session import SessionState
    from visor.wire.message import Message

log = get_logger("visor.gating")

DENIED_REQUEST = errors.INVALID_PARAMS
DENIED_SERVER_REQUEST = errors.INVALID_REQUEST

# Client requests that carry data the policy must see before the server does.
GATED_CLIENT_METHODS = frozenset(("resources/read", "resources/subscribe", "prompts/get"))
# Server requests the policy can refuse, by the short name used in the policy.
SERVER_REQUEST_KEYS = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}


def _decision(action: str, rule: str, reason: str) -> Decision:
    from visor.policy.evaluate import Decision

    return Decision(action, rule, reason)  # type: ignore[arg-type]


def _registration(policy: Policy, server: str, what: str) -> Decision | None:
    """The server-level part of registration, shared by resources and prompts."""
    entry = policy.server(server)
    if entry is None:
        if policy.default_action == "deny":
            return _decision("deny", "registration.unknown_server", f"server {server!r} is not in the policy")
        return None
    if not entry.allowed:
        return _decision(
            "deny", f"servers[{entry.name}].allowed", f"server {entry.name!r} is not allowed ({what})"
        )
    return None


def _acl(
    acl: AccessList | None,
    candidates: tuple[str, ...],
    rule: str,
    what: str,
    path_forms: tuple[str, ...] = (),
) -> Decision | None:
    """Deny wins if any reading matches a deny glob (compared as a case-insensitive
    file system would); an allow list must admit every reading of a file path
    (as a path or as its ``file://`` URI), else the name or URI as written."""
    if acl is None:
        return None
    readings = candidates + path_forms
    for glob in acl.deny:
        if any(glob.match(c) or glob.match_folded(c) for c in readings):
            return _decision("deny", f"{rule}.deny", f"{what} matches deny pattern {glob.pattern!r}")
    if acl.allow is None:
        return None
    if path_forms:
        admitted = all(any(g.match(f) or g.match("file://" + f) for g in acl.allow) for f in path_forms)
    else:
        admitted = any(g.match(c) for g in acl.allow for c in candidates)
    if not admitted:
        return _decision("deny", f"{rule}.allow", f"{what} matches no allow pattern")
    return None


def resource_decision(policy: Policy, server: str, uri: str) -> Decision | None:
    """A deny, or None when the URI may be read.

    A ``file:`` URI goes through the same normalisation and sensitive-file
    list as a path argument of a tool (symlinks resolved where the file
    exists), so ``file:///home/me/.env`` is denied with no ``resources:``
    section at all. Allow/deny globs match the URI as written and, for a
    file URI, each normalised form of its path.
    """
    candidates: tuple[str, ...] = (uri,)
    if uri[:5].lower() == "file:":
        try:
            forms = paths.forms(uri)
        except paths.PathError as e:
            return _decision("deny", "resource.invalid", f"resource URI cannot be checked: {e}")
        extra = policy.settings.sensitive_paths  # redaction.sensitive_files joined them at load
        for form in forms:
            if paths.is_sensitive(form, extra):
                return _decision(
                    "deny", "resource.sensitive", f"resource {uri!r} names a sensitive file ({form})"
                )
        path_forms: tuple[str, ...] = forms
    else:
        path_forms = ()
    found = _registration(policy, server, "resources")
    if found is not None:
        return found
    entry = policy.server(server)
    prefix = f"servers[{entry.name}].resources" if entry else "resources"
    return _acl(entry.resources if entry else None, candidates, prefix, f"resource {uri!r}", path_forms)


def prompt_decision(policy: Policy, server: str, name: str) -> Decision | None:
    """A deny, or None. Without a ``prompts:`` section an allowed server's prompts are allowed:
    a prompt is a template the user picks, it runs nothing, and its arguments are redacted."""
    found = _registration(policy, server, "prompts")
    if found is not None:
        return found
    entry = policy.server(server)
    prefix = f"servers[{entry.name}].prompts" if entry else "prompts"
    return _acl(entry.prompts if entry else None, (name,), prefix, f"prompt {name!r}")


def prompt_arguments_decision(policy: Policy, arguments: dict[str, Any]) -> Decision | None:
    """A deny when a prompt argument names a sensitive file, under every reading of it.

    A prompt that reads a file named by its argument hands the file to the
    model as surely as a tool does: its arguments get the tool arguments'
    path and sensitive-file checks (Visor's own files are checked by the gate).
    """
    extra = policy.settings.sensitive_paths  # redaction.sensitive_files joined them at load
    candidates: list[dict[str, Any]] = [arguments]
    try:
        decoded = readings.every_decoding(arguments)
    except readings.AmbiguousJson as e:
        return _decision("deny", "prompt.invalid", f"a prompt argument cannot be read with certainty: {e}")
    if decoded is not None:
        candidates.append(decoded)
    for args in candidates:
        for name, raw in paths.iter_path_values(args):
            try:
                forms = paths.forms(raw)
            except paths.PathError as e:
                return _decision("deny", "prompt.invalid", f"prompt argument {name!r} cannot be checked: {e}")
            for form in forms:
                if paths.is_sensitive(form, extra):
                    return _decision(
                        "deny",
                        "prompt.sensitive",
                        f"prompt argument {name!r} names a sensitive file ({form})",
                    )
    return None


def server_request_decision(policy: Policy, server: str, method: str) -> Decision | None:
    """A deny for a server-initiated request the policy refuses, else None (the default is allow:
    the client itself asks its user before sampling or showing an elicitation)."""
    key = SERVER_REQUEST_KEYS.get(method)
    if key is None:
        return None
    entry = policy.server(server)
    if entry is not None and entry.server_requests.get(key) == "deny":
        return _decision(
            "deny",
            f"servers[{entry.name}].server_requests.{key}",
            f"the policy refuses {method} from this server",
        )
    return None


def statically_denied(policy: Policy, session: SessionState, tool: str) -> bool:
    """Whether every call of `tool` is denied whatever its arguments (what hide_denied_tools hides)."""
    entry = session.server_entry
    default_deny = policy.default_action == "deny"
    if entry is None:
        return default_deny
    if not entry.allowed:
        return True
    eff = session.effective(tool)
    if not eff.registered and default_deny:
        return True
    te = eff.entry
    return te is not None and (te.allowed is False or te.max_calls == 0)


def _rewrite(obj: dict[str, Any], key: str, value: Any) -> bytes:
    """The message with one top-level member replaced; every other field kept as parsed.

    orjson writes integers exactly (ids above 2**53 stay integers) and compactly, on one line.
    """
    out = dict(obj)
    out[key] = value
    return orjson.dumps(out)


class DataGuard:
    """Per-session: the compiled redactor, the tools' output schemas, the audit callback."""

    def __init__(self, policy: Policy, server: str, append: Callable[[dict[str, Any]], None]) -> None:
        self.policy = policy
        self.server = server
        self._append = append
        engine = policy.redaction.engine
        self.redactor: redact.Redactor = engine if engine is not None else redact.DEFAULT_REDACTOR
        self.max_output = policy.settings.max_output_size_bytes
        self.output_schemas: dict[str, Any] = {}

    # ------------------------------------------------------------ evidence
    def _redacted(self, direction: str, msg_id: Any, findings: list[redact.Finding], **detail: Any) -> None:
        event: dict[str, Any] = {
            "event": "redact",
            "server": self.server,
            "direction": direction,
            "id": msg_id,
            "fields": [f.as_json() for f in findings],
        }
        event.update({k: v for k, v in detail.items() if v is not None})
        self._append(event)

    def _denied(self, decision: Decision, msg: Message, **detail: Any) -> None:
        event: dict[str, Any] = {
            "event": "deny",
            "server": self.server,
            "method": msg.method,
            "id": msg.id,
            "rule": decision.rule,
            "reason": decision.reason,
            "policy": self.policy.sha256,
        }
        event.update({k: v for k, v in detail.items() if v is not None})
        self._append(event)
        # the same one line on stderr as a denied tool call (resources, prompts, server requests)
        from visor.watch import announce

        announce(None, event, log)

    # ---------------------------------------------------------- tools/call
    def redact_call(self, msg: Message) -> Message:
        """The call with secrets in its arguments replaced (raw, obj and arguments), or `msg` itself.

        Called after the policy has evaluated the original arguments; the
        server and the audit log see only the redacted ones.
        """
        pset = self.redactor.arguments
        if msg.arguments is None or not pset.may_match(msg.raw):
            return msg
        new_args, findings = redact.redact_arguments(pset, msg.arguments)
        if not findings:
            return msg
        params = {**msg.obj["params"], "arguments": new_args}
        raw = _rewrite(msg.obj, "params", params)
        self._redacted("arguments", msg.id, findings, tool=msg.tool, method=msg.method)
        return msg._replace(raw=raw, obj=orjson.loads(raw), arguments=new_args)

    def tool_result(self, tool: str | None, response: Message) -> bytes | None:
        result = response.obj.get("result")
        if type(result) is not dict:
            return None
        new = result
        findings: list[redact.Finding] = []
        notes: dict[str, Any] = {}
        pset = self.redactor.outputs
        if pset.may_match(response.raw):
            new, findings = redact.redact_tool_result(pset, result)
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
            self._append(
                {"event": "redact", "server": self.server, "direction": "output", "id": response.id,
                 "tool": tool, "method": "tools/call", "fields": [], **notes}
            )  # fmt: skip
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
        tools = result.get("tools") if type(result) is dict else None
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
    def client_request(self, msg: Message) -> bytes | None:
        """For a gated client request: an error line for the client (denied), the rewritten
        request for the server (prefixed with b"S"), or None (forward unchanged)."""
        params = msg.obj.get("params")
        params = params if type(params) is dict else {}
        if msg.method in ("resources/read", "resources/subscribe"):
            uri = params.get("uri")
            if type(uri) is not str:
                return None  # the server answers a malformed request itself
            decision = resource_decision(self.policy, self.server, uri)
            if decision is not None:
                self._denied(decision, msg, uri=uri)
                return self._error(msg, decision)
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
                return self._error(msg, decision)
            pset = self.redactor.arguments
            if type(args) is dict and pset.may_match(msg.raw):
                new_args, findings = redact.redact_arguments(pset, args)
                if findings:
                    self._redacted("arguments", msg.id, findings, method=msg.method, prompt=name)
                    return b"S" + _rewrite(msg.obj, "params", {**params, "arguments": new_args})
        return None

    def _error(self, msg: Message, decision: Decision) -> bytes:
        return errors.error_response(
            msg.id,
            DENIED_REQUEST,
            f"Visor denied {msg.method}: {decision.reason} (rule: {decision.rule})",
            {"visor": {"rule": decision.rule}},
        )

    def response(self, method: str, response: Message) -> bytes | None:
        """Redact a resources/read or prompts/get result."""
        result = response.obj.get("result")
        pset = self.redactor.outputs
        if type(result) is not dict or not pset.may_match(response.raw):
            return None
        if method == "resources/read":
            new, findings = redact.redact_resource_result(pset, result)
        elif method == "prompts/get":
            new, findings = redact.redact_prompt_result(pset, result)
        else:
            return None
        if not findings:
            return None
        self._redacted("output", response.id, findings, method=method)
        return _rewrite(response.obj, "result", new)

    def redact_server_request(self, msg: Message) -> bytes | None:
        """A sampling/createMessage or elicitation/create with secrets in its text redacted."""
        params = msg.obj.get("params")
        pset = self.redactor.outputs
        if type(params) is not dict or not pset.may_match(msg.raw):
            return None
        findings: list[redact.Finding] = []
        new = redact.redact_value(params, pset, "$.params", findings)
        if not findings:
            return None
        self._redacted("server_request", msg.id, findings, method=msg.method)
        return _rewrite(msg.obj, "params", new)

    def server_request(self, msg: Message) -> bytes | None:
        """An error line to send back to the server when its request is refused, else None."""
        assert msg.method is not None
        decision = server_request_decision(self.policy, self.server, msg.method)
        if decision is None:
            if msg.method in SERVER_REQUEST_KEYS:
                self._append(
                    {
                        "event": "allow",
                        "server": self.server,
                        "method": msg.method,
                        "id": msg.id,
                        "direction": "server",
                        "rule": "server_requests.default",
                        "reason": f"{msg.method} is allowed from this server",
                        "policy": self.policy.sha256,
                    }
                )
            return None
        self._denied(decision, msg, direction="server")
        return errors.error_response(
            msg.id,
            DENIED_SERVER_REQUEST,
            f"Visor denied {msg.method}: {decision.reason} (rule: {decision.rule})",
        )
