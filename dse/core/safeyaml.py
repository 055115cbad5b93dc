"""A YAML reader for files written by someone else: PyYAML's safe loader with limits.

On top of ``yaml.safe_load`` it refuses, at parse time and with the line of the problem:

- alias expansion beyond a small bound (a 1.8 KB anchor chain expands to 9^9 nodes) and
  recursive aliases (``&a [*a]``);
- nesting deeper than :data:`~dse.core.bounds.MAX_YAML_DEPTH`;
- duplicate keys in a mapping (PyYAML keeps the last one silently);
- numbers written with more than :data:`~dse.core.bounds.MAX_SCALAR_CHARS` characters (Python
  refuses to convert an int of more than 4,300 digits; no field needs more than 40).

Errors are ``yaml.MarkedYAMLError`` subclasses, like PyYAML's own, so a caller that reports
``problem`` and ``problem_mark`` reports these too.

For the other direction, :func:`comment` writes text of anyone's choosing (a name from an
imported file) as one YAML comment line: everything else dse writes into a YAML file goes
through ``yaml.safe_dump``, which quotes what it must.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from dse.core.bounds import (
    MAX_SCALAR_CHARS,
    MAX_YAML_ALIASES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    one_line,
)

__all__ = ["comment", "safe_load"]

_MERGE = "tag:yaml.org,2002:merge"


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise ComposerError(
                    None,
                    None,
                    f"more than {MAX_YAML_ALIASES} aliases in one document",
                    event.start_mark,  # type: ignore[arg-type]
                )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: the base class says so
                if first is not None:
                    shown = repr(key) if len(repr(key)) <= 80 else repr(key)[:77] + "..."
                    raise ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key {shown} (first given at line {first + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)  # type: ignore[arg-type]

    def _short_number(self, node: ScalarNode) -> None:
        if len(node.value) > MAX_SCALAR_CHARS:
            raise ConstructorError(
                None,
                None,
                f"a number of {len(node.value)} characters is too long "
                f"(at most {MAX_SCALAR_CHARS})",
                node.start_mark,
            )

    def construct_bounded_int(self, node: ScalarNode) -> int:
        self._short_number(node)
        return self.construct_yaml_int(node)  # type: ignore[no-any-return]

    def construct_bounded_float(self, node: ScalarNode) -> float:
        self._short_number(node)
        return self.construct_yaml_float(node)  # type: ignore[no-any-return]


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_bounded_float)


try:
    from yaml._yaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None  # type: ignore[assignment,misc]

if _CParser is not None:

    class _FastBoundedLoader(_BoundedLoader, _CParser):  # type: ignore[misc,name-defined]
        """The same loader on libyaml's scanner and parser (the events), with the Python
        composer of :class:`_BoundedLoader` (and its limits) on top: the scan, most of the
        time of a large file, runs in C; composing stays here, so every limit above holds
        (libyaml's parser keeps its own stack, not the C one, however deep the nesting)."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)  # type: ignore[attr-defined]
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._aliases = 0
            self._depth = 0

        # the Python composer's, not CParser's C one (which knows no limits)
        get_single_node = yaml.composer.Composer.get_single_node
        compose_document = yaml.composer.Composer.compose_document
        check_event = _CParser.check_event  # type: ignore[attr-defined]
        peek_event = _CParser.peek_event  # type: ignore[attr-defined]
        get_event = _CParser.get_event  # type: ignore[attr-defined]
        dispose = _CParser.dispose  # type: ignore[attr-defined]

    _Loader: type[_BoundedLoader] = _FastBoundedLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _Loader = _BoundedLoader


def _expanded_size(root: Node) -> None:
    """Count the nodes of the document with aliases expanded; refuse cycles and a count
    above :data:`MAX_YAML_NODES` (linear in the nodes as written, whatever the expansion)."""
    memo: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in on_path:
            raise ComposerError(None, None, "an alias refers to itself", node.start_mark)
        on_path.add(key)
        n = 1
        if isinstance(node, SequenceNode):
            children: list[Node] = list(node.value)
        elif isinstance(node, MappingNode):
            children = [c for pair in node.value for c in pair]
        else:
            children = []
        for child in children:
            n += size(child)
            if n > MAX_YAML_NODES:
                raise ComposerError(
                    None,
                    None,
                    f"the document expands to more than {MAX_YAML_NODES} nodes "
                    "(aliases of aliases?)",
                    node.start_mark,
                )
        on_path.discard(key)
        memo[key] = n
        return n

    size(root)


def _clamp_to_text(e: yaml.MarkedYAMLError, text: str) -> None:
    """libyaml marks an error at the end of a file without a final newline on the line after
    the last one: name the last line (as PyYAML's own scanner does) instead."""
    last = text.count("\n")  # the line the text ends on
    for attr in ("problem_mark", "context_mark"):
        mark = getattr(e, attr, None)
        if mark is not None and mark.line > last:
            column = len(text.rsplit("\n", 1)[-1])
            setattr(e, attr, yaml.Mark(mark.name, mark.index, last, column, None, 0))


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)`` with the limits of this module (one document)."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            # libyaml's scanner reads flow brackets ahead of the composer and stops at its
            # own nesting limit (1,000) first: the same refusal, said as this module says it
            if "maximum nesting depth" not in str(e.problem):
                _clamp_to_text(e, text)
                raise
            raise ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", e.problem_mark
            ) from None
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def comment(text: str) -> str:
    """``text`` as one YAML comment line (``# text``), whatever it holds.

    What is not printable is written escaped (:func:`~dse.core.bounds.one_line`): that
    covers every character YAML ends a line at (``\\n``, ``\\r``, ``\\x85``, ``\\u2028``,
    ``\\u2029``; a line break in a comment would start a line of live YAML: a key, a ``---``
    or ``...`` document marker) and the control characters YAML refuses in a file.
    """
    return "# " + one_line(text)
