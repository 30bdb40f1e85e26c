"""The typed YAML reader under the policy loader.

A policy is composed into YAML nodes, which keep their line numbers, and read
through ``Reader``: every wrong shape, type or value is a ``PolicyError``
naming the file, the line and the key path. Nothing here knows what a policy
says; the sections (visor/policy/loader.py) and the rule types
(visor/policy/ruletypes.py) do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import NoReturn

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from visor.policy import paths
from visor.policy.schema import Glob


class PolicyError(Exception):
    """A policy that must not be used. ``str(e)`` is ``file:line: key.path: message``."""

    def __init__(self, source: str, line: int, key: str, message: str) -> None:
        self.source = source
        self.line = line
        self.key = key
        self.message = message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


TAG = "tag:yaml.org,2002:"
# What a plain scalar's spelling resolves to with no tag (YAML 1.1, as the loader reads it).
_RESOLVER = yaml.resolver.Resolver()


class Reader:
    """Typed access to composed YAML nodes, with errors that carry marks."""

    def __init__(self, source: str, hints: Mapping[tuple[str, str], str] | None = None) -> None:
        self.source = source
        # (level, key) -> where a key misplaced at that level belongs
        self.hints: Mapping[tuple[str, str], str] = hints or {}

    def fail(self, node: Node | None, key: str, message: str) -> NoReturn:
        line = node.start_mark.line + 1 if node is not None else 0
        raise PolicyError(self.source, line, key, message)

    def mapping(
        self,
        node: Node,
        key: str,
        allowed: set[str] | frozenset[str],
        required: tuple[str, ...] = (),
        kind: str = "",
    ) -> dict[str, Node]:
        if not isinstance(node, MappingNode):
            self.fail(node, key, f"expected a mapping, got {kind_of(node)}")
        out: dict[str, Node] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode) or knode.tag != TAG + "str":
                self.fail(knode, key, f"keys must be strings, got {kind_of(knode)}")
            name = knode.value
            if name in out:
                self.fail(knode, f"{key}.{name}" if key else name, f"duplicate key {name!r}")
            if name not in allowed:
                hint = self.hints.get((kind, name))
                where = f" at {kind} level" if kind else ""
                extra = f" ({hint})" if hint else f"; expected one of: {', '.join(sorted(allowed))}"
                self.fail(knode, f"{key}.{name}" if key else name, f"unknown key {name!r}{where}{extra}")
            out[name] = vnode
        for r in required:
            if r not in out:
                self.fail(node, f"{key}.{r}" if key else r, f"missing required key {r!r}")
        return out

    def str_(self, node: Node, key: str, nonempty: bool = True) -> str:
        if not isinstance(node, ScalarNode) or node.tag != TAG + "str":
            self.fail(node, key, f"expected a string, got {kind_of(node)}")
        value = str(node.value)
        if nonempty and not value.strip():
            self.fail(node, key, "must not be empty")
        return value

    def bool_(self, node: Node, key: str) -> bool:
        if not isinstance(node, ScalarNode) or node.tag != TAG + "bool":
            self.fail(node, key, f"expected true or false, got {kind_of(node)}")
        self._untagged_reading(node, key, "true or false")
        return node.value.lower() in ("true", "yes", "on")

    def int_(self, node: Node, key: str, minimum: int = 0) -> int:
        if not isinstance(node, ScalarNode) or node.tag != TAG + "int":
            self.fail(node, key, f"expected an integer, got {kind_of(node)}")
        self._untagged_reading(node, key, "an integer")
        try:
            value = int(node.value.replace("_", ""), 0)
        except ValueError:
            self.fail(node, key, f"expected an integer, got {node.value!r}")
        if value < minimum:
            self.fail(node, key, f"must be >= {minimum}, got {value}")
        return value

    def _untagged_reading(self, node: ScalarNode, key: str, expected: str) -> None:
        # An explicit tag (`!!bool "1"`, `!!int " 7"`) puts a spelling under a type that
        # readers take differently (`"1"` is false here, `y` true in YAML 1.1's list):
        # the value must be one that reads as that type with no tag at all.
        plain: str = _RESOLVER.resolve(ScalarNode, node.value, (True, False))  # type: ignore[no-untyped-call]
        if plain != node.tag:
            self.fail(node, key, f"expected {expected}, got {node.value!r} under an explicit tag")

    def list_(self, node: Node, key: str) -> list[Node]:
        if isinstance(node, ScalarNode) and node.tag == TAG + "null":
            return []
        if not isinstance(node, SequenceNode):
            self.fail(node, key, f"expected a list, got {kind_of(node)}")
        return list(node.value)

    def strs(self, node: Node, key: str, nonempty: bool = False) -> tuple[str, ...]:
        items = self.list_(node, key)
        if nonempty and not items:
            self.fail(node, key, "must not be an empty list")
        return tuple(self.str_(n, f"{key}[{i}]") for i, n in enumerate(items))

    def choice(self, node: Node, key: str, choices: tuple[str, ...]) -> str:
        value = self.str_(node, key)
        if value not in choices:
            self.fail(node, key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def regex(self, node: Node, key: str, flags: int = 0) -> re.Pattern[str]:
        text = self.str_(node, key)
        try:
            return re.compile(text, flags)
        except re.error as e:
            self.fail(node, key, f"regular expression {text!r} does not compile: {e}")

    def glob(self, node: Node, key: str) -> Glob:
        text = self.str_(node, key)
        if not text.startswith(("/", "*")) and not text.startswith("~"):
            # relative globs resolve against the working directory, like relative paths
            text = os.path.join(os.getcwd(), text)
        elif text.startswith("~"):
            text = os.path.expanduser(text)
        try:
            return paths.compile_glob(text)
        except re.error as e:
            self.fail(node, key, f"glob {text!r} does not compile: {e}")


def kind_of(node: Node | None) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, ScalarNode):
        t = node.tag.removeprefix(TAG)
        return {
            "str": "a string",
            "int": "an integer",
            "bool": "a boolean",
            "null": "null",
            "float": "a number",
        }.get(t, t) + (f" ({node.value!r})" if t != "null" else "")
    return "nothing"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that composes only; duplicate keys are caught by the reader."""


# libyaml's parser, when PyYAML was built with it, for the texts shipped inside
# the package (the default policy and the built-in packs): it composes them
# about fifteen times faster, which is most of `visor run`'s policy load. The
# node trees are the same (tests/policy/test_embedded_yaml.py builds both);
# a user's file keeps the pure-Python parser, whose error messages are quoted.
_EmbeddedLoader: type = getattr(yaml, "CSafeLoader", _StrictLoader)


def compose(text: str, source: str, *, embedded: bool = False) -> Node | None:
    """The YAML node tree of `text`; `embedded` for Visor's own texts only (above)."""
    try:
        return yaml.compose(text, Loader=_EmbeddedLoader if embedded else _StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        raise PolicyError(source, line, "", f"invalid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise PolicyError(source, 0, "", f"invalid YAML: {e}") from None
