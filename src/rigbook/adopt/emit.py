"""The YAML `provision adopt` writes: every value with a comment saying where it was read, then what was not pinned;
checked to read back (yaml.safe_load) as exactly the adopted values. Text from the box (keys, values, comments) may
hold anything: scalars are written as JSON (which is YAML), comments kept on one line."""

from __future__ import annotations

import json
import re

import yaml

from rigbook.errors import UserError

PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _scalar(value) -> str:
    """VALUE as YAML reads it back unchanged (JSON is YAML: strings double-quoted, escapes and all)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return json.dumps(value)
    raise UserError(f"adopt: cannot write {type(value).__name__} {value!r}")


def _key(key) -> str:
    """A mapping key: plain when it is a plain name, else quoted (an environment variable's name comes from the box
    and may hold anything but '=')."""
    return key if isinstance(key, str) and PLAIN_KEY.match(key) else _scalar(key)


def comment(text: str) -> str:
    """TEXT on one line: what the box said may hold control characters, never a line break into the YAML."""
    return json.dumps(str(text))[1:-1]


def _is_flat(value) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value)


def _emit(value, comments: dict, path: tuple, indent: int, out: list, first_prefix: str | None = None) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            lead = first_prefix if (i == 0 and first_prefix is not None) else pad
            note = comments.get(path + (key,))
            tail = f"  # {comment(note)}" if note else ""
            name = _key(key)
            if isinstance(item, dict) or (isinstance(item, list) and not _is_flat(item)):
                out.append(f"{lead}{name}:{tail}")
                _emit(item, comments, path + (key,), indent + 2, out)
            elif isinstance(item, list):
                out.append(f"{lead}{name}: [{', '.join(_scalar(v) for v in item)}]{tail}")
            else:
                out.append(f"{lead}{name}: {_scalar(item)}{tail}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            note = comments.get(path + (i,))
            if note:
                out.append(f"{pad}# {comment(note)}")
            if isinstance(item, dict):
                _emit(item, comments, path + (i,), indent + 2, out, first_prefix=pad + "- ")
            else:
                out.append(f"{pad}- {_scalar(item)}")


def render(host: str, variables: dict, comments: dict, unpinned: list, notes: list) -> str:
    """The YAML file adopt writes: a header, every value with where it was read, then what was not pinned."""
    out = ["---", f"# Written by `provision adopt {host}` from what the box runs; each value says where it was read.",
           "# Review it, then: provision site.yml -i INV --limit HOST --check --diff"]
    for text in notes:
        out.append(f"# note: {comment(text)}")
    _emit(variables, comments, (), 0, out)
    if unpinned:
        out.append("# Not pinned (adopt could not read or decide these; the roles keep their defaults):")
        out += [f"# - {comment(text)}" for text in unpinned]
    text = "\n".join(out) + "\n"
    if yaml.safe_load(text) != variables:  # the file must say exactly what was read
        raise UserError("adopt: the written YAML does not read back as the adopted values (a bug: please report)")
    return text
