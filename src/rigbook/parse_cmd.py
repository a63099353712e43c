"""`provision parse KIND FILE`: run one of the collection's text parsers and print JSON.

The parsers live in the collection (plugins/module_utils/parse/*.py) so the targets run the
same code (output formats: docs/parse-formats.md); this module only picks one, reads the input and prints the result.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Callable, Dict

from rigbook.errors import UserError
from rigbook.paths import link_collection

_MODULE_UTILS = "ansible_collections.rigbook.homelab.plugins.module_utils.parse."

# kind -> (module, function)
_PARSERS = {
    "lspci": ("lspci", "parse"),
    "nvidia-smi-q": ("nvidia_smi", "parse_q"),
    "nvidia-smi-topo": ("nvidia_smi", "parse_topo"),
    "nccl-tests": ("nccl", "parse_tests"),
    "nccl-log": ("nccl", "parse_log"),
    "p2p-bandwidth": ("p2p_bandwidth", "parse"),
    "sglang-log": ("sglang_log", "parse"),
    "kernel-log": ("kernel_log", "parse"),
}


def _loader(module: str, func: str) -> Callable[[str], dict]:
    def run(text: str) -> dict:
        link_collection()
        return getattr(importlib.import_module(_MODULE_UTILS + module), func)(text)

    run.__name__ = "parse_" + module
    return run


KINDS: Dict[str, Callable[[str], dict]] = {kind: _loader(m, f) for kind, (m, f) in _PARSERS.items()}


def read_input(file: str) -> str:
    if file == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        return data.decode("utf-8", errors="replace")
    try:
        with open(file, "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}") from None


def main(kind: str, file: str) -> int:
    parser = KINDS.get(kind)
    if parser is None:
        raise UserError("unknown parse kind {!r}; known kinds: {}".format(kind, ", ".join(KINDS)))
    text = read_input(file)
    result = parser(text)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0
