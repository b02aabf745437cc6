"""Reading a YAML file the way the apiserver would take it, within bounds (the CLI's input).

- Size: at most MAX_INPUT_BYTES, refused before parsing. 3 MiB is the apiserver's own limit on
  a request body (k8s.io/apiserver pkg/server/config.go, `MaxRequestBodyBytes: 3 * 1024 * 1024`,
  twice etcd's default 1.5 MiB request limit, etcd.io/docs "System limits"): an object larger
  than that can never be applied, and PyYAML took 29 s and 843 MiB for 18 MB.
- Nesting: at most MAX_DEPTH levels (a pod template's deepest field is about 15 down); deeper
  input is refused while it is composed, before PyYAML's recursion could overflow the stack.
- Aliases: at most MAX_NODES nodes once every alias is expanded (a "billion laughs" document is
  small as text and endless as data: every later walk of it would expand it).
- Duplicate keys are an error naming the key and its line: the apiserver refuses them
  (`json: duplicate field`), while PyYAML would silently keep the last.
- Only JSON's types: a timestamp stays the string it is written as (as the apiserver reads it);
  `!!binary`, `!!set`, `!!omap` and `!!pairs` are refused.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_INPUT_BYTES = 3 * 1024 * 1024
MAX_DEPTH = 100
MAX_NODES = 1_000_000


class InputTooLarge(ValueError):
    """The input is above MAX_INPUT_BYTES."""


class TooDeep(yaml.MarkedYAMLError):
    """Nested deeper than MAX_DEPTH."""


def _mark_line(node: Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}" if mark else "unknown line"


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader with a depth bound, duplicate keys refused and JSON's types only."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise TooDeep(
                    None,
                    None,
                    f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} ({_mark_line(key_node)}; first at "
                    f"{_mark_line(seen[key])}): the apiserver refuses it; keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_as_string(self, node: ScalarNode) -> str:
        return str(node.value)

    def refuse(self, node: Node) -> Any:
        raise ConstructorError(
            None,
            None,
            f"the tag {node.tag} is not a JSON type (a Kubernetes object is JSON)",
            node.start_mark,
        )


BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", BoundedLoader.construct_as_string)
for _tag in ("binary", "set", "omap", "pairs"):
    BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", BoundedLoader.refuse)


def _expanded_size(root: Node) -> int:
    """How many nodes `root` is with every alias expanded (shared nodes counted each time)."""
    memo: dict[int, int] = {}
    order: list[Node] = []
    stack: list[Node] = [root]
    while stack:  # post-order without recursion: children before parents
        node = stack.pop()
        if id(node) in memo:
            continue
        memo[id(node)] = -1
        order.append(node)
        stack.extend(_children(node))
    for node in reversed(order):
        memo[id(node)] = min(MAX_NODES + 1, 1 + sum(memo[id(c)] for c in _children(node)))
    return memo[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_all(data: bytes | str) -> list[Any]:
    """Every document in `data`, None (empty documents) left out. Raises InputTooLarge,
    yaml.YAMLError (syntax, duplicate key, depth, a non-JSON tag, too many nodes) or
    UnicodeDecodeError."""
    if len(data) > MAX_INPUT_BYTES:
        raise InputTooLarge(
            f"{len(data)} bytes, more than the {MAX_INPUT_BYTES} ({MAX_INPUT_BYTES // 2**20} MiB) "
            "a Kubernetes apiserver accepts in one request"
        )
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    loader = BoundedLoader(text)
    docs = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None and _expanded_size(node) > MAX_NODES:
                raise yaml.MarkedYAMLError(
                    None, None, f"more than {MAX_NODES} values once its aliases are expanded",
                    node.start_mark,
                )  # fmt: skip
            doc = loader.construct_document(node)
            if doc is not None:
                docs.append(doc)
    finally:
        loader.dispose()
    return docs
