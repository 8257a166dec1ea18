"""Reading multi-document YAML safely, keeping each document's node tree so problems can name a line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml


@dataclass(frozen=True, slots=True)
class RawDocument:
    index: int  # 1-based position among the file's documents
    data: Any
    node: yaml.Node | None = None
    duplicate_keys: tuple[tuple[str, int, int], ...] = field(default=())  # (key, line, first line)

    @property
    def line(self) -> int | None:
        return None if self.node is None else self.node.start_mark.line + 1

    def line_of(self, loc: Sequence[int | str]) -> int | None:
        """The line of the deepest node on ``loc`` that exists (the key's line for a mapping entry)."""
        node, line = self.node, self.line
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
                if match is None:
                    break
                line, node = match[0].start_mark.line + 1, match[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line


class _Loader(yaml.SafeLoader):
    """SafeLoader that records duplicate mapping keys (PyYAML silently keeps the last one)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, int, int]] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                self.duplicates.append((str(key), line, seen[key]))
            else:
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


class YamlSyntaxError(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def parse_documents(text: str) -> list[RawDocument]:
    """Every non-empty document of ``text``, in order (empty ones keep their index but are skipped)."""
    loader = _Loader(text)
    docs: list[RawDocument] = []
    index = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            index += 1
            data = loader.construct_document(node)
            duplicates = tuple(loader.duplicates)
            loader.duplicates.clear()
            if data is not None:
                docs.append(RawDocument(index, data, node, duplicates))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = "; ".join(p for p in (exc.context, exc.problem) if p)
        raise YamlSyntaxError(f"invalid YAML: {what}", None if mark is None else mark.line + 1) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"invalid YAML: {exc}", None) from None
    finally:
        loader.dispose()
    return docs
