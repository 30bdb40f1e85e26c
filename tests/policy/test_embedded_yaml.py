"""Visor's own YAML (the default policy, the built-in packs) is composed by
libyaml for speed (visor/policy/reader.py): it must give exactly the tree,
and so the policy, that the pure-Python parser gives."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from visor.policy import loader, reader

pytestmark = pytest.mark.skipif(
    not getattr(yaml, "__with_libyaml__", False), reason="PyYAML without libyaml: one parser only"
)


def _embedded_texts() -> list[tuple[str, str]]:
    folder = resources.files("visor.policy")
    texts = [("default.yaml", (folder / "default.yaml").read_text(encoding="utf-8"))]
    for entry in sorted((folder / "packs").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            texts.append((f"packs/{entry.name}", entry.read_text(encoding="utf-8")))
    return texts


def _shape(node: Node) -> object:
    """Everything the reader looks at (tag, value, where the node starts), and the quoting style."""
    where = (node.start_mark.line, node.start_mark.column)
    if isinstance(node, ScalarNode):
        return ("scalar", node.tag, node.value, node.style or None, where)  # plain: None or ""
    if isinstance(node, SequenceNode):
        return ("sequence", node.tag, where, [_shape(n) for n in node.value])
    assert isinstance(node, MappingNode)
    return ("mapping", node.tag, where, [(_shape(k), _shape(v)) for k, v in node.value])


@pytest.mark.parametrize(("name", "text"), _embedded_texts(), ids=lambda v: v if "\n" not in v else "")
def test_libyaml_tree_equals_the_pure_python_tree(name: str, text: str) -> None:
    fast = reader.compose(text, name, embedded=True)
    slow = reader.compose(text, name)
    assert fast is not None and slow is not None
    assert _shape(fast) == _shape(slow)


def test_libyaml_is_used_for_embedded_texts_only() -> None:
    assert reader._EmbeddedLoader is yaml.CSafeLoader
    # a user's file keeps the pure-Python parser and its messages
    with pytest.raises(reader.PolicyError) as pure:
        reader.compose("a: 1\nb: [\n", "<user>")
    assert str(pure.value) == "<user>:3: invalid YAML: expected the node content, but found '<stream end>'"


def test_default_policy_and_packs_are_the_same_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = loader.load_default_policy()
    fast_packs = loader.builtin_packs()

    def pure(text: str, source: str, *, embedded: bool = False) -> Node | None:
        return reader.compose(text, source)

    monkeypatch.setattr(loader, "compose", pure)
    monkeypatch.setattr(loader, "_PACKS", None)
    slow = loader.load_default_policy()
    assert loader.builtin_packs() == fast_packs
    assert slow == fast  # every field but `compiled`, which is derived from the rest
