"""`provision parse KIND FILE`: run one of the collection's text parsers and print JSON.

The parsers live in the collection (plugins/module_utils/parse/*.py) so the targets run the
same code (output formats: docs/parse-formats.md); this module only picks one, streams the input to it (line by
line: a file of any size is never held whole) and prints the result, or says on stderr that the input holds nothing
of KIND (exit 2). It reads at most MAX_INPUT characters and MAX_LINES lines: more (a paste of days of logs, or
/dev/zero, which never ends) is refused with exit 2 and nothing printed.
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import sys
from contextlib import contextmanager
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

# A line longer than this reaches the parser in pieces of this size (no tool prints such a line; a file of one
# endless line still never sits in memory whole).
MAX_LINE = 1 << 20
# What one parse reads at most: 64 MiB of text (a character is at least a byte) or a million lines. No tool output
# parse reads comes near it; an endless input (/dev/zero, a FIFO) ends here instead of never.
MAX_INPUT = 64 << 20
MAX_LINES = 1_000_000

@functools.lru_cache(maxsize=None)
def _module(name: str):
    """The collection's parse/NAME module, linked and imported once per process."""
    link_collection()
    return importlib.import_module(_MODULE_UTILS + name)


def _loader(module: str, func: str) -> Callable:
    def run(text) -> dict:
        return getattr(_module(module), func)(text)

    run.__name__ = "parse_" + module
    return run


KINDS: Dict[str, Callable] = {kind: _loader(m, f) for kind, (m, f) in _PARSERS.items()}


def _found_any(*values) -> bool:
    return any(value not in (None, False, "", [], {}) for value in values)


# kind -> whether a result holds anything of that kind: the one place that decides "not recognised" (exit 2).
# kernel-log: a log with no error line is a fine result, so it is recognised by its lines (see recognised()).
_RECOGNISED = {
    "lspci": lambda r: _found_any(r["devices"]),
    "nvidia-smi-q": lambda r: _found_any(r["gpus"], r["driver_version"], r["cuda_version"]),
    "nvidia-smi-topo": lambda r: _found_any(r["gpus"], r["links"]),
    "nccl-tests": lambda r: _found_any(r["rows"], r["avg_busbw_gbs"], r["out_of_bounds"], r["collective"]),
    "nccl-log": lambda r: _found_any(r["nccl_version"], r["channels"], r["all_direct_p2p"], r["failures"]),
    "p2p-bandwidth": lambda r: _found_any(*r["matrices"].values(), r["p2p_connectivity"],
                                          r["unidirectional_p2p_enabled_reads"], r["latency_us"], r["devices"],
                                          r["can_access_peer"]),
    "sglang-log": lambda r: _found_any(r["version"], r["ready"], r["load_weight_s"], r["cuda_graph_s"],
                                       r["nccl_version"], r["transports"], r["gen_throughput_tok_s"],
                                       r["accept_len"], r["error_count"], r["server_args"]),
    "kernel-log": lambda r: _found_any(*(entry["count"] for key, entry in r.items() if isinstance(entry, dict))),
}


def recognised(kind: str, result: dict, kernel_lines: int = 0) -> bool:
    """Whether RESULT (KIND's parse) holds anything of KIND; a kernel log also by KERNEL_LINES, its lines with a
    kernel log's prefix."""
    return (kind == "kernel-log" and kernel_lines > 0) or _RECOGNISED[kind](result)


def is_kernel_line(line: str) -> bool:
    """Whether LINE carries a kernel log's prefix (parse/kernel_log.is_kernel_line, the one pattern)."""
    return _module("kernel_log").is_kernel_line(line)


def bounded_lines(handle, counter: dict, where: str = "the input"):
    """HANDLE's lines, one at a time (at most MAX_LINE characters each); COUNTER["kernel"] counts those with a kernel
    log's prefix. UserError (exit 2) naming WHERE past MAX_INPUT characters or MAX_LINES lines."""
    read = lines = 0
    while True:
        line = handle.readline(MAX_LINE)
        if not line:
            return
        read += len(line)
        lines += 1
        if read > MAX_INPUT or lines > MAX_LINES:
            raise UserError(f"{where}: more than {MAX_INPUT >> 20} MiB or {MAX_LINES:,} lines: parse reads at most "
                            "that much (an endless input such as /dev/zero never ends); give it the part that "
                            "matters, e.g. `tail -n 100000 FILE | provision parse KIND -`; nothing printed")
        if is_kernel_line(line):
            counter["kernel"] += 1
        yield line


@contextmanager
def open_input(file: str):
    """FILE (- for stdin) as a text stream: UTF-8, a bad byte read as U+FFFD, any line end read as one."""
    if file == "-":
        raw = getattr(sys.stdin, "buffer", None)
        if raw is None:  # a text stream with no bytes under it (a test's StringIO)
            yield sys.stdin
            return
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline=None)
        try:
            yield stream
        finally:
            stream.detach()  # stdin stays open for whoever owns it
        return
    try:
        handle = open(file, encoding="utf-8", errors="replace", newline=None)  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}") from None
    with handle:
        yield handle


def main(kind: str, file: str) -> int:
    parser = KINDS.get(kind)
    if parser is None:
        raise UserError("unknown parse kind {!r}; known kinds: {}".format(kind, ", ".join(KINDS)))
    counter = {"kernel": 0}
    where = "stdin" if file == "-" else file
    with open_input(file) as handle:
        try:
            result = parser(bounded_lines(handle, counter, where))
        except OSError as exc:  # a read error part way (EIO, a file that is a folder)
            raise UserError(f"cannot read {file}: {exc.strerror or exc}") from None
    if not recognised(kind, result, counter["kernel"]):
        raise UserError(f"{where}: the {kind} parser found nothing it reads in it (not {kind} output, or a part "
                        f"with none of its lines: docs/parse-formats.md says what each kind reads); nothing printed")
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0
