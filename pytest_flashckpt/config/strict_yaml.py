"""The YAML loader of every config file: PyYAML's ``SafeLoader`` minus what a config file never needs and an
adversary could abuse.

Refused (``Refused``, a ``ConstructorError`` with the line): a key given twice in one mapping (PyYAML silently
keeps the last value), an alias that refers to a node containing it, and aliases that expand a file by more than
``MAX_ALIAS_VALUES`` values (a 500-byte "billion laughs" file of nested ``&a`` / ``*a`` expands to gigabytes).
Anchors and aliases that repeat a block (a model mapping used by several scenarios) stay allowed, and so do merge
keys (``<<: *defaults``, with the spec's override order). ``config.typed.load_yaml`` reads files with it.
"""

from __future__ import annotations

import yaml

MAX_ALIAS_VALUES = 10_000  # values aliases may add to a file when expanded (the largest shipped file holds 254 in all)
MERGE_TAG = "tag:yaml.org,2002:merge"


class Refused(yaml.constructor.ConstructorError):
    """Valid YAML that a pytest-flashckpt file may not use (a duplicate key, an alias bomb, a recursive alias)."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _written_nodes(root: yaml.Node) -> int:
    """The file's values as written: each node once, however many aliases point at it."""
    written: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in written:
            written.add(id(node))
            stack.extend(_children(node))
    return len(written)


def check_expansion(root: yaml.Node) -> None:
    """Count the file's values with every alias expanded (each node's count computed once and capped, so the count
    costs only the file's size) against its values as written; refuse a recursive alias."""
    limit = _written_nodes(root) + MAX_ALIAS_VALUES
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise Refused(None, None, "a YAML alias refers to a mapping or list that contains it (a recursive "
                          "alias); write the value out", node.start_mark)
        active.add(key)
        total = 1
        for child in _children(node):
            total = min(total + size(child), limit + 1)
        active.discard(key)
        sizes[key] = total
        return total

    if size(root) > limit:
        raise Refused(None, None, f"YAML aliases expand this file by more than {MAX_ALIAS_VALUES:,} values (an "
                      "alias bomb?); write the values out or use fewer aliases", root.start_mark)


def _key_identity(key_node: yaml.Node):
    """A key known by its tag and text (PyYAML's own merge knows it by the ``id()`` of its string)."""
    return (key_node.tag, key_node.value) if isinstance(key_node, yaml.ScalarNode) else id(key_node)


def _first_of_each_key(pairs: list, taken: set) -> list:
    """``pairs`` without a key already ``taken`` or seen earlier in ``pairs``: an earlier map wins."""
    kept = []
    for key_node, value_node in pairs:
        if _key_identity(key_node) not in taken:
            taken.add(_key_identity(key_node))
            kept.append((key_node, value_node))
    return kept


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, alias bombs and recursive aliases (module docstring)."""

    Refused = Refused

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            check_expansion(node)
        return node

    def _merge_sources(self, node: yaml.MappingNode, value_node: yaml.Node) -> list:
        """The (key, value) pairs one ``<<`` brings: its map's, or each map's of its list, flattened first."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        pairs = []
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"a merge key (<<) takes a mapping or a list of mappings, not a {source.id}", source.start_mark)
            self.flatten_mapping(source)
            pairs.extend(source.value)
        return pairs

    def flatten_mapping(self, node):
        """YAML merge keys, as the spec has them: ``<<: *defaults`` or ``<<: [*a, *b]`` brings each merged map's
        keys in, an earlier map of a list winning over a later one and the mapping's own keys over them all.
        PyYAML's own ``flatten_mapping`` keeps the first of each merged key by the ``id()`` of the key's string, so
        two equal keys written in two maps are both kept and the later map wins; here a key is known by its tag and
        text. The result holds each merged key once, so a merged map that is constructed again later is not
        mistaken for one that writes a key twice."""
        merged, own = [], []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged.extend(self._merge_sources(node, value_node))
                continue
            if key_node.tag == "tag:yaml.org,2002:value":
                key_node.tag = "tag:yaml.org,2002:str"
            own.append((key_node, value_node))
        node.value = _first_of_each_key(merged, {_key_identity(key_node) for key_node, _ in own}) + own

    def construct_mapping(self, node, deep=False):
        """Refuse a key the mapping itself writes twice, before YAML merge keys (``<<: *defaults``, or a list of
        maps) are flattened in: a key a merge brings that the mapping also writes is YAML's override (the mapping's
        own key wins), never an error. Two ``<<`` keys in one mapping are a key given twice."""
        seen: dict = {}
        for key_node, _ in node.value:
            key = "<<" if key_node.tag == MERGE_TAG else self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # SafeLoader's own error follows
            if key in seen:
                raise Refused(
                    None, None, f"key {key!r} is given twice in one mapping (first on line {seen[key] + 1}); "
                    "keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)  # flattens the merges (SafeConstructor)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, StrictLoader.construct_mapping)
