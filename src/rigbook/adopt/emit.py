"""The YAML `provision adopt` writes: every value with a comment saying where it was read, then what was not pinned;
checked to read back, as rigbook's inventory reader reads it, as exactly the adopted values.

Text from the box (keys, values, comments) may hold anything, Jinja2 too (`{{ lookup('pipe', ...) }}` in a
process's command line). Ansible templates the strings of an inventory, so every adopted string is written with
Ansible's `!unsafe` tag: Ansible reads it as data, never as a template. ansible-core 2.19 resolves an `!unsafe`
scalar as if it had no tag (`!unsafe "12"` is the number 12 there), so a string that would read as another type
(a number, true, null, a date: none holds a template mark) is written quoted without the tag. Scalars are written
double-quoted, every character outside printable ASCII escaped; comments are kept on one line.
"""

from __future__ import annotations

import json
import math
import re

import yaml

from rigbook import inventory
from rigbook.errors import UserError

PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNSAFE = "!unsafe"
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()


def _quoted(text: str) -> str:
    """TEXT as a YAML double-quoted scalar: printable ASCII as it is, everything else escaped (\\xXX, \\uXXXX,
    \\UXXXXXXXX: a line break, a control character or an emoji reads back as itself)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def is_string_to_ansible(text: str) -> bool:
    """True when TEXT, untagged and plain, reads as a string (not a number, bool, null or date): the strings
    ansible-core reads as strings under `!unsafe`."""
    return _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) == _STR_TAG


def _scalar(value) -> str:
    """VALUE as YAML reads it back unchanged: a string `!unsafe` and double-quoted (Ansible never templates it)."""
    if isinstance(value, str):
        return f"{UNSAFE} {_quoted(value)}" if is_string_to_ansible(value) else _quoted(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"adopt: cannot write the number {value!r}")
    if isinstance(value, float):
        text = json.dumps(value)  # YAML 1.1 reads 1e+20 as a string: a float needs its dot (1.0e+20)
        return text if "." in text or "e" not in text else text.replace("e", ".0e", 1)
    if value is None or isinstance(value, (bool, int)):
        return json.dumps(value)
    raise UserError(f"adopt: cannot write {type(value).__name__} {value!r}")


def _key(key) -> str:
    """A mapping key: plain when it is a plain name, else written as a value is (a distribution's name, a path)."""
    return key if isinstance(key, str) and PLAIN_KEY.match(key) else _scalar(key)


def comment(text: str) -> str:
    """TEXT on one line: what the box said may hold control characters, never a line break into the YAML."""
    return json.dumps(str(text))[1:-1]


def load(text: str, where: str = "the adopted YAML"):
    """TEXT as rigbook's inventory reader reads it (rigbook.inventory: SafeLoader, no key twice, Ansible's
    `!unsafe` read as ansible-core reads it); UserError naming WHERE when it is not such YAML."""
    return inventory._parse_yaml(text, where)


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
    out = ["---", f"# Written by `provision adopt {comment(host)}` from what the box runs; each value says where it "
           "was read.", "# Strings are tagged !unsafe: Ansible reads them as data, never as templates.",
           "# Review it, then: provision site.yml -i INV --limit HOST --check --diff"]
    for text in notes:
        out.append(f"# note: {comment(text)}")
    _emit(variables, comments, (), 0, out)
    if unpinned:
        out.append("# Not pinned (adopt could not read or decide these; the roles keep their defaults):")
        out += [f"# - {comment(text)}" for text in unpinned]
    text = "\n".join(out) + "\n"
    if (load(text) or {}) != variables:  # the file must say exactly what was read (nothing: no values)
        raise UserError("adopt: the written YAML does not read back as the adopted values (a bug: please report)")
    return text
