"""Decisions on requests other than tools/call: resources, prompts, server requests.

Pure functions of the policy (and, for hidden tools, the session): each
returns a deny `Decision`, or None when the request may go ahead. The core
(visor/core/guard.py) turns a deny into the error a client or server reads
and the audit record.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING, Any

from visor import display
from visor.policy import ada, paths, readings
from visor.policy.evaluate import Decision
from visor.wire.folding import fold_lower

if TYPE_CHECKING:
    from visor.policy.schema import AccessList, Policy
    from visor.session import SessionState

# Server requests the policy can refuse, by the short name used in the policy.
SERVER_REQUEST_KEYS = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}


def _registration(policy: Policy, server: str, what: str) -> Decision | None:
    """The server-level part of registration, shared by resources and prompts."""
    entry = policy.server(server)
    if entry is None:
        if policy.default_action == "deny":
            return Decision("deny", "registration.unknown_server", f"server {server!r} is not in the policy")
        return None
    if not entry.allowed:
        return Decision(
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
    every = candidates + path_forms
    for glob in acl.deny:
        if any(glob.match(c) or glob.match_folded(c) for c in every):
            return Decision("deny", f"{rule}.deny", f"{what} matches deny pattern {glob.pattern!r}")
    if acl.allow is None:
        return None
    if path_forms:
        admitted = all(any(g.match(f) or g.match("file://" + f) for g in acl.allow) for f in path_forms)
    else:
        # every reading of the name or URI (as written, as a URL parser reads it)
        admitted = all(any(g.match(c) for g in acl.allow) for c in candidates)
    if not admitted:
        return Decision("deny", f"{rule}.allow", f"{what} matches no allow pattern")
    return None


# What a URL parser removes before it reads a URI: leading and trailing C0 controls and spaces,
# and tabs and newlines anywhere (WHATWG; Python's urlsplit strips the leading ones and drops the
# same three characters).
_C0_OR_SPACE = "".join(map(chr, range(0x21)))
_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")


def uri_readings(uri: str) -> tuple[str, ...]:
    """``uri`` as written and as a server's URL parser reads it: stripped as above, and as
    WHATWG serialises it (Node's ``new URL()``, which the TypeScript SDK applies to every
    resources/read before it matches a template: ``" file:///x"`` and ``"fi\tle:///x"`` are
    ``file:///x`` there)."""
    out = [uri]
    cleaned = uri.strip(_C0_OR_SPACE).translate(_TAB_OR_NEWLINE)
    if cleaned != uri:
        out.append(cleaned)
    try:
        href = ada.parse_url(uri, ("href",))["href"]
    except ValueError:  # no WHATWG reading: a server that parses so refuses the URI
        href = None
    if type(href) is str and href not in out:
        out.append(href)
    return tuple(out)


def resource_uris(method: str, params: dict[str, Any]) -> tuple[str, ...]:
    """The readings of the resource a request names beyond its params as written: every reading
    of its ``uri``, and of a completion's resource template with the value filled in."""
    uri = completion_uri(params) if method == "completion/complete" else params.get("uri")
    return uri_readings(uri) if type(uri) is str else ()


# Schemes whose resources are fetched over the network: reading one sends its URI out.
_NETWORK_SCHEMES = frozenset(
    {"http", "https", "ws", "wss", "ftp", "ftps", "sftp", "mailto", "smtp", "gopher"}
)


def network_uri(uri: str) -> bool:
    """Whether ``uri`` names a resource fetched over the network (by its scheme)."""
    scheme, colon, _ = uri.partition(":")
    return bool(colon) and scheme.strip().lower() in _NETWORK_SCHEMES


def resource_decision(policy: Policy, server: str, uri: str) -> Decision | None:
    """A deny, or None when the URI may be read.

    Every reading of the URI is judged (`uri_readings`: as written and as a URL parser reads
    it). A ``file:`` URI goes through the same normalisation and sensitive-file
    list as a path argument of a tool (symlinks resolved where the file
    exists), so ``file:///home/me/.env`` is denied with no ``resources:``
    section at all. Allow/deny globs match the URI as written and, for a
    file URI, each normalised form of its path.
    """
    candidates = uri_readings(uri)
    extra = policy.settings.sensitive_paths  # redaction.sensitive_files joined them at load
    path_forms: tuple[str, ...] = ()
    for reading in candidates:
        if reading[:5].lower() != "file:":
            continue
        try:
            forms = paths.forms(reading)
        except paths.PathError as e:
            return Decision("deny", "resource.invalid", f"resource URI cannot be checked: {e}")
        for form in forms:
            if paths.is_sensitive(form, extra):
                return Decision(
                    "deny", "resource.sensitive", f"resource {uri!r} names a sensitive file ({form})"
                )
        path_forms += tuple(f for f in forms if f not in path_forms)
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
        return Decision("deny", "prompt.invalid", f"a prompt argument cannot be read with certainty: {e}")
    if decoded is not None:
        candidates.append(decoded)
    for args in candidates:
        for name, raw in paths.iter_path_values(args):
            try:
                forms = paths.forms(raw)
            except paths.PathError as e:
                return Decision("deny", "prompt.invalid", f"prompt argument {name!r} cannot be checked: {e}")
            for form in forms:
                if paths.is_sensitive(form, extra):
                    return Decision(
                        "deny",
                        "prompt.sensitive",
                        f"prompt argument {name!r} names a sensitive file ({form})",
                    )
    return None


_TEMPLATE_EXPRESSION = re.compile(r"\{([^{}]*)\}")


def completion_uri(params: dict[str, Any]) -> str | None:
    """The resource a completion/complete of a resource template asks about: the template with
    the argument being completed, and those already resolved, put in as written (RFC 6570
    operators and modifiers dropped), as a server that lists what the partial value names reads
    it. None when the reference is not a template URI."""
    ref = params.get("ref")
    template = ref.get("uri") if type(ref) is dict else None
    if type(template) is not str:
        return None
    values: dict[str, str] = {}
    context = params.get("context")
    resolved = context.get("arguments") if type(context) is dict else None
    if type(resolved) is dict:
        values.update((k, v) for k, v in resolved.items() if type(v) is str)
    argument = params.get("argument")
    if type(argument) is dict and type(argument.get("name")) is str and type(argument.get("value")) is str:
        values[argument["name"]] = argument["value"]

    def put(m: re.Match[str]) -> str:
        names = m.group(1).lstrip("+#./;?&").split(",")
        return ",".join(values.get(n.split(":", 1)[0].rstrip("*"), "") for n in names)

    return _TEMPLATE_EXPRESSION.sub(put, template)


def server_request_decision(policy: Policy, server: str, method: str) -> Decision | None:
    """A deny for a server-initiated request the policy refuses, else None (the default is allow:
    the client itself asks its user before sampling or showing an elicitation)."""
    key = SERVER_REQUEST_KEYS.get(method)
    if key is None:
        return None
    entry = policy.server(server)
    if entry is not None and entry.server_requests.get(key) == "deny":
        return Decision(
            "deny",
            f"servers[{entry.name}].server_requests.{key}",
            f"the policy refuses {method} from this server",
        )
    return None


def sampling_tools_decision(policy: Policy, server: str, params: Any) -> Decision | None:
    """A deny for a sampling request that offers the client's model tools, unless the server's
    entry allows it (``server_requests.sampling_tools: allow``). The model then chooses calls the
    server runs itself, which never pass Visor as tools/call: no argument rule, budget or
    provenance check sees them. A member spelled in another case counts (a client that matches
    names case-insensitively, as Go's encoding/json does, reads it)."""
    if type(params) is not dict:
        return None
    offered = [v for k, v in params.items() if fold_lower(k) in ("tools", "toolchoice")]
    if not any(v not in (None, [], {}) for v in offered):
        return None
    entry = policy.server(server)
    if entry is not None and entry.server_requests.get("sampling_tools") == "allow":
        return None
    rule = (
        f"servers[{entry.name}].server_requests.sampling_tools"
        if entry is not None
        else "server_requests.sampling_tools"
    )
    return Decision(
        "deny",
        rule,
        "a sampling request that offers tools has the client's model choose calls the server runs "
        "without Visor judging them (server_requests: sampling_tools: allow permits it)",
    )


# Visor's approval questions and a server's elicitations appear in the same client dialog. A
# server question that speaks as Visor ("Visor: allow the tool call ...") would have a person
# answer the server believing it was Visor, or learn to say yes to anything that looks like it.
# Read as a person reads it: compatibility forms folded, invisible characters dropped, the look-alike
# letters a forger reaches for mapped, and separators between the letters ignored ("V.i.s.o.r");
# a word that begins with it ("VisorGuard") is one, a word that only ends with it (advisor,
# supervisor) is not.
_LOOKALIKES = str.maketrans(
    {
        "\u03bd": "v",
        "\u0475": "v",
        "\u0456": "i",
        "\u0131": "i",
        "\u03b9": "i",
        "\u0269": "i",
        "\u0455": "s",
        "\u043e": "o",
        "\u03bf": "o",
        "\u0585": "o",
        "\u0433": "r",
    }
)
_VISOR_WORD = re.compile(r"(?<![^\W\d_])v[\W_]*i[\W_]*s[\W_]*o[\W_]*r")


def _speaks_as_visor(text: str) -> bool:
    if text.isascii():  # the common case: nothing to fold, and controls only separate letters
        return _VISOR_WORD.search(text.lower()) is not None
    seen = "".join(ch for ch in unicodedata.normalize("NFKC", text) if not display.is_unsafe(ch))
    return _VISOR_WORD.search(seen.casefold().translate(_LOOKALIKES)) is not None


def elicitation_decision(params: Any) -> Decision | None:
    """A deny for a server's elicitation/create that speaks as Visor, or whose message could not
    carry the mark that says it is the server's (visor/approval/elicitation.py), else None."""
    if type(params) is not dict or type(params.get("message")) is not str:
        return Decision(
            "deny",
            "server_requests.elicitation.malformed",
            "an elicitation without a text message cannot be shown as the server's",
        )
    stack: list[Any] = [{k: v for k, v in params.items() if k != "_meta"}]
    while stack:
        node = stack.pop()
        if type(node) is str:
            if _speaks_as_visor(node):
                return Decision(
                    "deny",
                    "server_requests.elicitation.speaks_as_visor",
                    "a server's elicitation may not present itself as Visor's approval question",
                )
        elif type(node) is dict:
            stack.extend(node.keys())
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
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
