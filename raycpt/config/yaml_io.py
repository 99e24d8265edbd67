"""Reading a config file: a size bound, YAML without 1.1 octal, duplicate keys refused, alias expansion
bounded, one-line errors."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from raycpt.errors import RaycptError, read_user_text


MAX_CONFIG_BYTES = 1 << 20
"""A config file is at most 1 MiB (the shipped ones are under 4 KiB): a larger file is refused before parsing."""
MAX_CONFIG_NODES = 100_000
"""At most this many YAML nodes once every alias is expanded: a few hundred bytes of nested aliases (a
"billion laughs") would otherwise expand to gigabytes when the config is validated, copied or printed."""


class YamlLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 octal: ``01100`` (a plan pattern) stays a string, not 576; a key given
    twice in one mapping is an error naming both lines (PyYAML keeps the last silently); the tree's size
    with aliases expanded is bounded (:data:`MAX_CONFIG_NODES`)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one",
                        key_node.start_mark)
                seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)

    def construct_document(self, node):
        _check_expanded_size(node)
        return super().construct_document(node)


def _check_expanded_size(root) -> None:
    """The node count of ``root`` with aliases expanded (each shared node counted once per use), computed on
    the composed graph without expanding it; a YAMLError beyond :data:`MAX_CONFIG_NODES`."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        kids = [] if isinstance(node, yaml.ScalarNode) else (
            [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else list(node.value))
        if not done:
            stack.append((node, True))
            stack += [(k, False) for k in kids if id(k) not in sizes]
            continue
        sizes[id(node)] = min(1 + sum(sizes.get(id(k), 1) for k in kids), MAX_CONFIG_NODES + 1)
        if sizes[id(node)] > MAX_CONFIG_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"the YAML expands to more than {MAX_CONFIG_NODES:,} nodes through its aliases "
                            "(&anchor / *alias); a config needs no such nesting", root.start_mark)


YamlLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")
for _ch in "-+0":
    YamlLoader.yaml_implicit_resolvers.setdefault(_ch, []).insert(0, ("tag:yaml.org,2002:str", LEADING_ZERO))


def yaml_error_line(e: yaml.YAMLError) -> str:
    """A YAML error as the bounded tail of one line: `` at line N: problem`` (``: problem`` without a mark)."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return f"{where}: {str(getattr(e, 'problem', None) or e).splitlines()[0][:300]}"


def read_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    text = read_user_text(p, "config file", limit=MAX_CONFIG_BYTES, hint="a config is")
    try:
        data = yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as e:
        raise RaycptError(f"config file {p} is not valid YAML{yaml_error_line(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RaycptError(f"config file {p} must hold a mapping at the top level, not {type(data).__name__}")
    return data


def read_yaml_documents(path: str | os.PathLike, what: str, limit: int = MAX_CONFIG_BYTES,
                        hint: str = "") -> tuple[str, list[tuple[yaml.Node, object]]]:
    """Every document of a user-named YAML file (a Kubernetes manifest may hold several), read and parsed as a
    config is (:func:`read_user_text`'s bounds, this loader's alias bound and duplicate-key refusal): the text,
    and each document's composed node (with line marks) beside its data. One RaycptError line otherwise."""
    p = Path(path)
    text = read_user_text(p, what, limit=limit, hint=hint)
    loader = YamlLoader(text)
    docs: list[tuple[yaml.Node, object]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            docs.append((node, loader.construct_document(node)))
    except yaml.YAMLError as e:
        raise RaycptError(f"{what} {p} is not valid YAML{yaml_error_line(e)}") from None
    finally:
        loader.dispose()
    return text, docs
