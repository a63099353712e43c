# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence for the collectives and nccl_transport layers (all I/O; standard library only).

Live ("/"): nccl-tests / rccl-tests binaries when installed (sendrecv_perf and all_reduce_perf, plus
all_gather_perf and reduce_scatter_perf when built), else the bundled torch_bench run with the serving
environment's Python (sendrecv and all_reduce); the NCCL INFO log from that run or from the serving
unit's journal. Recorded root: var/lib/rigbook/commands/{collectives.json, nccl-tests-<op>.txt,
nccl-log.txt}.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import torch_bench
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, libraries, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl

NCCL_TESTS = {"all_reduce": "all_reduce_perf", "sendrecv": "sendrecv_perf", "all_gather": "all_gather_perf",
              "reduce_scatter": "reduce_scatter_perf"}
# Without these the tests are not run; the others run when their programs are there (an older build has only these).
REQUIRED_TESTS = ("all_reduce", "sendrecv")
P2P_LEVEL_RE = re.compile(r"NCCL_P2P_LEVEL set by environment to (\S+)")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0"}


def _recorded(root, name):
    return files.read_text(files.path(root, *runner.COMMANDS_DIR + (name,)))


def rows_from_nccl_tests(op, text):
    """The result of one nccl-tests run of OP (its largest row, out of place) from its output TEXT, or None."""
    parsed = parse_nccl.parse_tests(text or "")
    rows = [r for r in parsed.get("rows") or [] if r.get("out_of_place")]
    if not rows:
        return None
    row = max(rows, key=lambda r: r["size_bytes"])
    place = row["out_of_place"]
    wrong = place.get("wrong")
    return {"op": op, "size_bytes": row["size_bytes"], "time_us": place.get("time_us"),
            "algbw_gbs": place.get("algbw_gbs"), "busbw_gbs": place.get("busbw_gbs"),
            "wrong": wrong, "out_of_bounds": parsed.get("out_of_bounds")}  # fmt: skip


def _run(argv, timeout, env=None):
    """(stdout, None) of ARGV through facts/runner.output with SAFE_ENV and ENV over this process's environment, or
    (None, why)."""
    return runner.output(argv, timeout=timeout, env=dict(SAFE_ENV, **(env or {})))


def run_torch_bench(python, size, iters, timeout, env=None):
    """Run the bundled benchmark with PYTHON; returns its JSON dict (available false on any failure)."""
    # deferred: inspect costs ~4 ms to import here (~30 ms measured on a box); the health timer's serving runs import
    # this module and never call this
    import inspect

    handle, script = tempfile.mkstemp(prefix="rigbook-torch-bench-", suffix=".py")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(inspect.getsource(torch_bench))
        text, error = _run([python, script, "--size", str(size), "--iters", str(iters)], timeout, env)
    finally:
        os.unlink(script)
    if error:
        return {"available": False, "error": error}
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"available": False, "error": "the benchmark printed no JSON: %s" % text[-300:]}


def read_env_file(path):
    """(KEY -> value, error) of a KEY=VALUE environment file (the GPU environment file: comments, blank lines and
    an `export ` prefix allowed, one level of quotes stripped)."""
    text = files.read_text(path, strip=False)
    if text is None:
        return {}, "cannot read %s: %s" % (path, "no such file" if not os.path.lexists(path) else "unreadable")
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key.strip()):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env, None


def gpu_env(env, env_file):
    """(environment, {env_file, env_file_error, env_file_keys}) the tests run with: the GPU environment file alone
    when given (it is what every serve unit reads first, on both vendors), else ENV."""
    if not env_file:
        return dict(env or {}), {}
    file_env, error = read_env_file(env_file)
    return dict(file_env), {"env_file": env_file, "env_file_error": error, "env_file_keys": sorted(file_env)}


def _usable(binaries):
    """{op: binary} of BINARIES ({op: path or None}) that are there, when every REQUIRED_TESTS one is; else None."""
    found = {op: b for op, b in binaries.items() if b and os.path.isfile(b) and os.access(b, os.X_OK)}
    return found if all(op in found for op in REQUIRED_TESTS) else None


def _built_tests(nccl_tests_dir):
    """{op: binary} of the rccl-tests / nccl-tests programs in NCCL_TESTS_DIR (None when a required one is missing
    there; all_gather_perf and reduce_scatter_perf are run when they are there)."""
    if not nccl_tests_dir:
        return None
    return _usable({op: os.path.join(nccl_tests_dir, name) for op, name in NCCL_TESTS.items()})


LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)", re.M)  # NAME => PATH (0x...): NCCL/RCCL by facts/libraries


def resolved_library(binary, env, run=None):
    """{"path", "sha256"} of the NCCL/RCCL library BINARY loads with environment ENV, as the dynamic loader resolves
    it (`ldd`: DT_RPATH, LD_LIBRARY_PATH, the loader's paths, in its order), or {"error"}: the library the
    collectives tests measure, which the serving layer holds the engine's mapped one to."""
    text, error = (run or _run)(["ldd", binary], 30, env)
    if error:
        return {"error": error}
    found = [m for m in LDD_LINE.finditer(text or "") if libraries.is_collectives(m.group(1))]
    if not found:
        return {"error": "%s loads no libnccl/librccl (ldd)" % binary}
    path = os.path.realpath(found[0].group(2))
    if not os.path.isfile(path):
        return {"path": path, "sha256": None, "version": None}
    sha, error = files.digest(path)
    if error:
        return {"path": path, "sha256": None, "version": None, "error": error}
    return {"path": path, "sha256": sha, "version": library_version(path, env)}


# ncclGetVersion's code is MAJOR*10000 + MINOR*100 + PATCH (NCCL_VERSION_CODE since 2.9); asked in a process of its
# own, so loading a GPU library cannot take the ladder's module run down with it.
VERSION_SCRIPT = ("import ctypes, sys\nv = ctypes.c_int()\n"
                  "ok = ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)) == 0\n"
                  "print('%d.%d.%d' % (v.value // 10000, v.value // 100 % 100, v.value % 100) if ok else '')\n")


def library_version(path, env=None):
    """The NCCL version the library at PATH reports (ncclGetVersion), or None."""
    text, error = _run([sys.executable, "-c", VERSION_SCRIPT, path], 30, env)
    version = (text or "").strip()
    return version if not error and re.match(r"^\d+\.\d+\.\d+$", version) else None


def verified_library(nccl_tests_dir, env=None, env_file=None):
    """resolved_library of the built collectives tests in NCCL_TESTS_DIR with the GPU environment file (what the
    collectives layer runs them with), or None when there are none."""
    built = _built_tests(nccl_tests_dir)
    if not built:
        return None
    run_env, _ = gpu_env(env, env_file)
    return resolved_library(built["sendrecv"], run_env)


def run_tests(binaries, root, size, iters, gpus, timeout, env, env_file=None, ab=False):
    """Run the built tests once per op with NCCL_DEBUG=INFO (and the GPU environment file when given, alone: it is
    what the serving unit reads); with AB, sendrecv once more with NCCL_P2P_DISABLE=1. The evidence root is passed
    as RIGBOOK_EVIDENCE_ROOT (real tests ignore it; the lab's stand-ins read their recorded figures there)."""
    data = {"source": "rccl-tests/nccl-tests in %s" % os.path.dirname(binaries["sendrecv"]), "results": []}
    run_env, env_data = gpu_env(env, env_file)
    data.update(env_data)
    run_env["NCCL_DEBUG"] = "INFO"
    run_env["RIGBOOK_EVIDENCE_ROOT"] = root or "/"
    errors, logs = [], []
    argv_tail = ["-b", str(size), "-e", str(size), "-g", str(gpus), "-n", str(iters)]
    for op, binary in binaries.items():
        text, error = _run([binary] + argv_tail, timeout, run_env)
        row = rows_from_nccl_tests(op, text) if text else None
        if row:
            data["results"].append(row)
            logs.append(text)
        else:
            errors.append(error or "%s printed no result row" % binary)
    if ab and not errors:
        text, error = _run([binaries["sendrecv"]] + argv_tail, timeout, dict(run_env, NCCL_P2P_DISABLE="1"))
        row = rows_from_nccl_tests("sendrecv", text) if text else None
        with_p2p = [r for r in data["results"] if r["op"] == "sendrecv"]
        if row and with_p2p and row.get("busbw_gbs") and with_p2p[0].get("busbw_gbs") is not None:
            data["ab"] = {"op": "sendrecv", "busbw_gbs": with_p2p[0]["busbw_gbs"],
                          "p2p_disabled_busbw_gbs": row["busbw_gbs"],
                          "gain": round(with_p2p[0]["busbw_gbs"] / row["busbw_gbs"], 3)}
        else:
            data["ab"] = {"error": error or "the NCCL_P2P_DISABLE=1 run printed no result row"}
    log = "\n".join(logs)
    levels = P2P_LEVEL_RE.findall(log)
    data.update(available=bool(data["results"]), error="; ".join(errors) or None, nccl_log=log,
                p2p_level=levels[-1] if levels else None, library=resolved_library(binaries["sendrecv"], run_env))
    return data


def log_summary(text):
    """What an NCCL/RCCL INFO log says of the path between the GPUs (parse/nccl.parse_log): {all_direct_p2p,
    all_cuda_p2p, path, transports, nccl_version}; the collectives layer judges the run's own log with it."""
    parsed = parse_nccl.parse_log(text or "")
    return {key: parsed[key] for key in ("all_direct_p2p", "all_cuda_p2p", "path", "transports", "nccl_version")}


def collect_collectives(root, python=None, nccl_tests_dir=None, size=256 << 20, iters=10, gpus=2, timeout=300,
                        env=None, env_file=None, ab=False):  # fmt: skip
    """The collectives run (see _collect_collectives), with `log`: the log_summary of its own NCCL INFO log when it
    kept one (the tests' output, the bundled benchmark's NCCL_DEBUG_FILE, a recorded run's nccl_log)."""
    data = _collect_collectives(root, python, nccl_tests_dir, size, iters, gpus, timeout, env, env_file, ab)
    if isinstance(data.get("nccl_log"), str) and data["nccl_log"].strip():
        data["log"] = log_summary(data["nccl_log"])
    return data


def _collect_collectives(root, python, nccl_tests_dir, size, iters, gpus, timeout, env, env_file, ab):
    built = _built_tests(nccl_tests_dir)
    if built:  # the tests named by nccl_tests_dir run on any root (a lab host runs its built stand-ins)
        return run_tests(built, root, size, iters, gpus, timeout, env, env_file, ab)
    if not files.is_live(root):
        data, error = files.read_json(files.path(root, *runner.COMMANDS_DIR + ("collectives.json",)))
        if error or (data is not None and not isinstance(data, dict)):
            return {"available": False, "source": "recorded collectives.json",
                    "error": error or "recorded collectives.json is not a JSON object"}
        if data is not None:
            data.setdefault("source", "recorded collectives.json")
            return data
        results = []
        for op in NCCL_TESTS:
            row = rows_from_nccl_tests(op, _recorded(root, "nccl-tests-%s.txt" % op))
            if row:
                results.append(row)
        if results:
            return {"available": True, "source": "recorded nccl-tests output", "results": results}
        return {"available": False, "error": "no recorded collectives.json or nccl-tests output under " + root}
    env, env_data = gpu_env(env, env_file)
    search = os.pathsep.join(filter(None, [nccl_tests_dir, os.environ.get("PATH")]))
    binaries = _usable({op: shutil.which(name, path=search) for op, name in NCCL_TESTS.items()})
    if binaries:
        results, errors = [], []
        for op, binary in binaries.items():
            text, error = _run([binary, "-b", str(size), "-e", str(size), "-g", str(gpus), "-n", str(iters)],
                               timeout, env)  # fmt: skip
            row = rows_from_nccl_tests(op, text) if text else None
            if row:
                results.append(row)
            else:
                errors.append(error or "%s printed no result row" % binary)
        return dict(env_data, available=bool(results), source="nccl-tests", results=results,
                    error="; ".join(errors) or None)
    if python:
        data = run_torch_bench(python, size, iters, timeout, env)
        data.update(env_data, source="bundled torch.distributed benchmark (%s)" % python)
        return data
    return {"available": False, "error": "no nccl-tests binaries (all_reduce_perf, sendrecv_perf) and no serving "
                                         "Python to run the bundled benchmark with"}  # fmt: skip


def collect_nccl_log(root, log_text=None, unit=None, python=None, timeout=120, env=None):
    """(text, source) of an NCCL INFO log: given, recorded, the unit's journal, or a short bundled run."""
    if log_text:
        return log_text, "given"
    if not files.is_live(root):
        text = _recorded(root, "nccl-log.txt")
        return text, ("recorded nccl-log.txt" if text is not None else "no recorded nccl-log.txt under " + root)
    if unit:
        text, error = _run(["journalctl", "-u", unit, "-b", "--no-pager", "-o", "cat"], timeout)
        if text and "NCCL INFO" in text:
            return text, "journal of %s" % unit
    if python:
        data = run_torch_bench(python, 1 << 20, 2, timeout, env)
        if data.get("available"):
            return data.get("nccl_log") or "", "bundled benchmark (NCCL_DEBUG=INFO)"
        return None, data.get("error")
    return None, "no log given, no serving unit journal with NCCL lines, no serving Python"


def transport_evidence(text, source):
    parsed = parse_nccl.parse_log(text or "")
    levels = P2P_LEVEL_RE.findall(text or "")
    parsed["p2p_level"] = levels[-1] if levels else None
    parsed["source"] = source
    parsed["available"] = text is not None
    return parsed
