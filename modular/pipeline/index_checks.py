"""Checks on an index file's contents before anything in it is imported, loaded or registered."""

from __future__ import annotations

import json
import re
from typing import Any

from components.load_id import LOAD_ID_FIELDS
from components.repo import subfolder_escape
from modular.errors import IndexFileError

__all__ = ["CLASSIC_INDEX", "ENTRY_FIELDS", "MAX_DEPTH", "MODULAR_INDEX", "check_index"]

MODULAR_INDEX = "modular_model_index.json"
CLASSIC_INDEX = "model_index.json"

#: Deeper than any index needs (entry, loading fields, type_hint); deeper JSON is refused before it is used.
MAX_DEPTH = 32
#: Keys of a modular entry's loading fields: the load ID's, its type, and the peer's deprecated ``repo``.
ENTRY_FIELDS = (*LOAD_ID_FIELDS, "type_hint", "repo")
#: Metadata keys read by the framework; each is a string when present.
_STRING_KEYS = ("_class_name", "_blocks_class_name", "_workflow", "_diffusers_version", "_name_or_path")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SHAPES = {
    CLASSIC_INDEX: "[library, class] (or [null, null] for a component the repo does not have)",
    MODULAR_INDEX: "[library, class, {loading fields}]",
}


def check_index(kind: str, index: Any, source: str) -> None:
    """Checks the shape of a parsed index before anything in it is imported, loaded or registered.

    ``index`` must be a JSON object. A value that is a list of two or three items is a component entry and
    must have the kind's shape: ``[library, class]`` in ``model_index.json``, ``[library, class, {loading
    fields}]`` in ``modular_model_index.json``, where library and class are both strings or both null, the
    loading fields are among ``ENTRY_FIELDS``, each a string or null, and ``type_hint`` is ``[library, class]``.
    An object holding loading fields is a misplaced component entry. An entry without a repo loads from the
    index's own folder, so its subfolder must stay inside it. Every other value is a config value.

    Args:
        kind: ``MODULAR_INDEX`` or ``CLASSIC_INDEX``.
        index: The parsed JSON.
        source: The file, as errors name it.

    Raises:
        IndexFileError: naming the file and listing every problem, each with its entry.
    """
    if not isinstance(index, dict):
        shown = "" if _depth(index) > MAX_DEPTH else f" ({_show(index)})"
        problem = (
            f"the file holds a JSON {_json_kind(index)}{shown}; an index is a JSON object of component "
            f"entries and config values"
        )
        raise IndexFileError(source, [problem])
    problems = []
    for name, value in index.items():
        problems.extend(_entry_problems(kind, name, value))
    if problems:
        raise IndexFileError(source, problems)


def _entry_problems(kind: str, name: str, value: Any) -> list[str]:
    label = f"entry {name!r}"
    if _depth(value) > MAX_DEPTH:
        return [
            f"{label} is nested more than {MAX_DEPTH} levels deep; index entries are a few levels at most"
        ]
    if name.startswith("_"):
        if name not in _STRING_KEYS or value is None or isinstance(value, str):
            return []
        if name == "_class_name" and _is_string_pair(value):
            return []  # a custom pipeline's [module, class]: no family serves it, which the lookup says
        return [f"{label} must be a string (got {_show(value)}, a JSON {_json_kind(value)})"]
    if isinstance(value, dict) and not set(value).isdisjoint(ENTRY_FIELDS):
        fields = sorted(set(value) & set(ENTRY_FIELDS))
        return [
            f"{label} is an object with loading fields {fields}; a component entry is {_SHAPES[kind]}, and "
            f"a config value holds no loading fields"
        ]
    if not isinstance(value, list | tuple) or len(value) not in (2, 3):
        return []  # a config value
    size = 2 if kind == CLASSIC_INDEX else 3
    if len(value) != size:
        return [
            f"{label} has {len(value)} items ({_show(value)}); a component entry of {kind} is {_SHAPES[kind]}"
        ]
    problems = _class_problems(label, "", value[0], value[1])
    if (kind == MODULAR_INDEX or value[0] is not None) and not name.isidentifier():
        problems.append(f"{label}: a component's name must be a Python identifier such as 'unet'")
    if kind == MODULAR_INDEX:
        problems.extend(_fields_problems(label, value[2]))
    return problems


def _class_problems(label: str, where: str, library: Any, class_name: Any) -> list[str]:
    """Problems of a ``[library, class]`` pair; ``where`` says where the pair is inside the entry."""
    problems = []
    for role, item in (("library", library), ("class", class_name)):
        if item is not None and not isinstance(item, str):
            problems.append(
                f"{label}: the {role}{where} must be a string or null (got {_show(item)}, a JSON {_json_kind(item)})"
            )
    if problems:
        return problems
    if (library is None) != (class_name is None):
        problems.append(
            f"{label}: library{where} and class{where} must both be strings or both be null "
            f"(got {_show([library, class_name])})"
        )
    elif library is not None:
        if not _MODULE.match(library):
            problems.append(
                f"{label}: the library{where} must be a module name such as 'diffusers' (got {library!r})"
            )
        if not class_name.isidentifier():
            problems.append(
                f"{label}: the class{where} must be a class name such as 'UNet2DConditionModel' (got {class_name!r})"
            )
    return problems


def _fields_problems(label: str, fields: Any) -> list[str]:
    if fields is None:
        return []
    if not isinstance(fields, dict):
        return [
            f"{label}: the third item must be an object of loading fields or null (got {_show(fields)}, a JSON "
            f"{_json_kind(fields)})"
        ]
    problems = []
    unknown = sorted(set(fields) - set(ENTRY_FIELDS))
    if unknown:
        problems.append(f"{label} has unknown loading field(s) {unknown}; known: {list(ENTRY_FIELDS)}")
    for key in ENTRY_FIELDS:
        value = fields.get(key)
        if key == "type_hint" and value is not None:
            if not isinstance(value, list | tuple) or len(value) != 2:
                problems.append(
                    f"{label}: type_hint must be [library, class] or null (got {_show(value)}, a JSON "
                    f"{_json_kind(value)})"
                )
            else:
                problems.extend(_class_problems(label, " of type_hint", value[0], value[1]))
        elif key != "type_hint" and value is not None:
            if not isinstance(value, str):
                problems.append(
                    f"{label}: {key} must be a string or null (got {_show(value)}, a JSON {_json_kind(value)})"
                )
            elif "|" in value or value == "null":
                problems.append(
                    f"{label}: {key} must not be 'null' or contain '|', which load IDs reserve (got {value!r})"
                )
    if problems:
        return problems
    repo, alias = fields.get("pretrained_model_name_or_path"), fields.get("repo")
    if repo is not None and alias is not None and repo != alias:
        problems.append(
            f"{label}: repo ({alias!r}) and pretrained_model_name_or_path ({repo!r}) disagree; repo is a "
            f"deprecated alias, keep pretrained_model_name_or_path"
        )
    subfolder = fields.get("subfolder")
    escape = subfolder_escape(subfolder) if subfolder else None
    if escape is not None and repo is None and alias is None:
        problems.append(
            f"{label}: subfolder {subfolder!r} leaves the index's folder ({escape}); an entry without "
            f"pretrained_model_name_or_path loads from the index's own repo, so its subfolder must stay "
            f"inside it. Name the repo in pretrained_model_name_or_path, or fix the subfolder"
        )
    return problems


def _is_string_pair(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list | tuple) else "object"


def _show(value: Any, limit: int = 80) -> str:
    """``value`` as JSON, cut at ``limit`` characters."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):
        text = f"a JSON {_json_kind(value)}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
