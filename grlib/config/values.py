"""Plain values from YAML text a user hands over: the one reader of notebook parameters (`-p`),
config overrides (`-o KEY=VALUE`, overrides given as text) and params.yaml.

    load_plain('{"model.n_layers": 2}')        # {'model.n_layers': 2}
    load_plain("2024-05-01")                    # '2024-05-01': a date stays its text
    load_plain("!!omap [{a: 1}]")               # PlainYAMLError: the tag !!omap is not allowed
    describe(err, "params.yaml")                # 'params.yaml:3:7: the tag !!set is not allowed ...'
    plain_problem((1, 2))                       # 'a tuple is not a plain value ...' (None for a plain one)

A plain value is what JSON can write: None, bool, int, float, str, a list of plain values, a dict
with string keys and plain values. yaml.SafeLoader gives more: `!!omap` / `!!pairs` make lists of
tuples, `!!set` a set, `!!binary` bytes, `2024-05-01` a datetime.date. papermill's Python translator
writes such a value into the parameters cell as `"<str(value)>"`, unescaped, so a double quote in a
tuple's text ends that string and the rest of it runs in the kernel; a date is no JSON value
(papermill's JSON metadata cannot hold it: TypeError). PlainLoader therefore:

  * refuses every explicit tag (`!!omap`, `!!python/...`, `!!str`, `!x`, `!`): one error naming the
    tag and where it stands (quote a text instead of tagging it);
  * resolves untagged scalars as SafeLoader does (null, bool, int, float, str) except that a
    timestamp (`2024-05-01`, `2024-05-01T10:00:00`), `=` and `<<` (YAML 1.1's value and merge
    keys; merging needs an alias, see below) stay strings, and that `1e-3` is a number as in JSON
    and YAML 1.2 (YAML 1.1 wants a dot, `1.0e-3`: SafeLoader reads `1e-3` as a string). A date is
    kept as its text rather than refused: `-p data 2024-05-01` then is the string "2024-05-01",
    which is what a string parameter wants, and a parameter of another type refuses it by its own
    check (grlib.cli.notebook) with a message about the type, not about YAML;
  * refuses a mapping key that is not a string (`{1: a}`, `{null: a}`: quote it);
  * refuses aliases (`*name`): a plain value shares no part and cannot contain itself (`&a [*a]`);
    a few nested aliases would also expand to gigabytes when papermill writes the value out;
  * refuses nesting deeper than MAX_DEPTH levels (the composer recurses: no RecursionError), and an
    integer of more than MAX_INT_BITS bits (int() and str() raise ValueError past 4,300 digits).

SafeLoader itself is not changed: the resolver and constructor tables are copies on PlainLoader.
"""
from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode

MAX_DEPTH = 100  # nesting levels of lists and mappings
MAX_INT_BITS = 1024  # beyond any float; str() of an int has a limit (4,300 digits) that a message would hit
PLAIN = "plain values only: null, true/false, numbers, strings, lists, mappings with string keys"

_YAML = "tag:yaml.org,2002:"
_STR = _YAML + "str"
_KEPT_AS_TEXT = {_YAML + "timestamp", _YAML + "value", _YAML + "merge"}  # resolvers PlainLoader leaves out
_PLAIN_TAGS = [_YAML + name for name in ("null", "bool", "int", "float", "str", "seq", "map")]


class PlainYAMLError(yaml.MarkedYAMLError):
    """YAML text that is valid but not a plain value (a tag, an alias, a key that is not a string,
    nesting too deep). A yaml.YAMLError, so that code catching YAML errors catches it."""


def _shown_tag(tag: str) -> str:
    tag = "!!" + tag[len(_YAML):] if tag.startswith(_YAML) else tag
    return tag if len(tag) <= 60 else tag[:57] + "..."


class PlainLoader(yaml.SafeLoader):
    """yaml.SafeLoader that yields plain values only (see the module's docstring)."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _KEPT_AS_TEXT]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for first in "-+0123456789":  # 1e-3, 2E5: a float (after SafeLoader's own number patterns)
        yaml_implicit_resolvers[first] = [*yaml_implicit_resolvers.get(first, []),
                                          (_YAML + "float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"))]
    del first
    yaml_constructors = {tag: SafeConstructor.yaml_constructors[tag] for tag in _PLAIN_TAGS}
    yaml_constructors[None] = SafeConstructor.construct_undefined  # any other tag: an error
    yaml_multi_constructors: dict = {}

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            raise PlainYAMLError(None, None, f"the alias *{event.anchor} is not allowed: write the value out",
                                 event.start_mark)
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.tag is not None:
            raise PlainYAMLError(None, None, f"the tag {_shown_tag(event.tag)} is not allowed; {PLAIN}; "
                                             "quote a text instead of tagging it", event.start_mark)
        if isinstance(event, CollectionStartEvent):
            if self._depth >= MAX_DEPTH:
                raise PlainYAMLError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            value = None
        if value is None or value.bit_length() > MAX_INT_BITS:
            raise PlainYAMLError(None, None, f"the integer {node.value[:20]}... is too large (more than "
                                             f"{MAX_INT_BITS} bits)", node.start_mark)
        return value

    yaml_constructors[_YAML + "int"] = construct_yaml_int

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        for key, _ in node.value:
            if key.tag != _STR:
                text = key.value if isinstance(key.value, str) else f"a {key.id}"
                raise PlainYAMLError(None, None, f"the key {text[:40]} is not a string: quote it", key.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_plain(text: str | bytes) -> Any:
    """The plain value of YAML `text` (bytes: UTF-8, or UTF-16 with a byte order mark); yaml.YAMLError
    (PlainYAMLError for what is valid YAML but no plain value) otherwise."""
    return yaml.load(text, Loader=PlainLoader)  # noqa: S506 (PlainLoader is a SafeLoader)


def describe(err: yaml.YAMLError, source: str | None = None, text: str | None = None) -> str:
    """One line for a YAML error: "SOURCE:LINE:COLUMN: problem" with `source` (a file), else
    "line L, column C: problem", or "column C: problem" for an error on a text's first line.
    `text` (what was read) places a reader error (a character YAML refuses) by line and column."""
    line = column = None
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        problem = err.problem or err.context or "not valid YAML"
        opened = err.context_mark
        if err.problem and err.context and opened is not None and opened is not mark:  # e.g. an unclosed [
            problem += f" ({err.context} at line {opened.line + 1}, column {opened.column + 1})"
        if mark is not None:
            line, column = mark.line + 1, mark.column + 1
    elif isinstance(err, yaml.reader.ReaderError):
        code = err.character if isinstance(err.character, int) else ord(err.character[:1] or b"\0")
        problem = f"the character U+{code:04X} is not allowed in YAML ({err.reason})"
        if text is not None and 0 <= err.position <= len(text):
            line = text.count("\n", 0, err.position) + 1
            column = err.position - (text.rfind("\n", 0, err.position) + 1) + 1
    else:
        problem = (str(err).splitlines() or ["not valid YAML"])[0]
    if source is not None:
        return f"{source}:{line}:{column}: {problem}" if line is not None else f"{source}: {problem}"
    if line is None:
        return problem
    return f"column {column}: {problem}" if line == 1 else f"line {line}, column {column}: {problem}"


def read_plain_file(data: bytes, source: str) -> Any:
    """The plain value of a YAML file's bytes (UTF-8, a byte order mark allowed); ValueError with one
    line "SOURCE:LINE:COLUMN: problem" for bytes that are not UTF-8 or not a plain YAML value."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"{source}:{line}:{column}: not UTF-8 text (byte 0x{data[err.start]:02x})") from None
    try:
        return load_plain(text)
    except yaml.YAMLError as err:
        raise ValueError(describe(err, source, text)) from None


def shown(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (control characters escaped, as repr does)."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4,300 digits
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def plain_problem(value: Any) -> str | None:
    """None if `value` is a plain value, else one line saying where it is not: "a tuple is not a plain
    value (...)", "['a'][0]: a set is not a plain value (...)", "['a']: the key 1 is not a string"."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        at = f"{where}: " if where else ""
        if type(item) is int and item.bit_length() > MAX_INT_BITS:
            return f"{at}an integer of more than {MAX_INT_BITS} bits is too large"
        if item is None or type(item) in (bool, int, float, str):  # exact types: papermill writes str(item)
            continue
        if depth >= MAX_DEPTH:
            return f"{at}nested deeper than {MAX_DEPTH} levels"
        if type(item) is list:
            stack += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item)]
        elif type(item) is dict:
            for key, v in item.items():
                if not isinstance(key, str):
                    return f"{at}the key {shown(key, 40)} is not a string"
                stack.append((v, f"{where}[{key[:40]!r}]", depth + 1))
        else:
            return f"{at}a {type(item).__name__} is not a plain value; {PLAIN}"
    return None
