"""Prometheus's own tools for the tests: `promtool()` (Debian's promtool, fetched once when missing),
`metric_names()` (the metric names a PromQL expression reads) and `health_names()` (the names the health program
writes).

promtool is a static binary in Debian's `prometheus` package. `apt-get install prometheus` brings the server and
eleven JavaScript packages with it (96 MB installed; 49 s measured on the 2-core CI machine, under the test load);
this takes the package alone through apt (`apt-get download`: the signed archive, checked as an install checks it)
and unpacks only /usr/bin/promtool into a cache folder (10 s there, once; nothing installed, no service). Where apt
is (Debian, as CI), a promtool that cannot be had is a failure, never a skip; a machine without apt-get or dpkg-deb
is a skip, except in CI (the CI variable set).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

PACKAGE = "prometheus"


def _cache() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/rigbook/tools")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rigbook" / "tools"


def _missing(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"promtool: {why} (CI must run promtool: Debian's `{PACKAGE}` package)")
    pytest.skip(f"needs promtool (Debian's `{PACKAGE}` package): {why}")


def promtool() -> str:
    """promtool: on PATH, else the one this helper unpacked before, else Debian's, fetched now (see the module)."""
    found = shutil.which("promtool")
    if found:
        return found
    cached = sorted(_cache().glob("promtool-*"))
    if cached:
        return str(cached[-1])
    apt, dpkg_deb = shutil.which("apt-get"), shutil.which("dpkg-deb")
    if not apt or not dpkg_deb:
        _missing("no apt-get and dpkg-deb here to fetch it")
    _cache().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_cache()) as work:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        get = subprocess.run([apt, "download", "-q", PACKAGE], cwd=work, env=env, capture_output=True, text=True,
                             timeout=600)
        if get.returncode != 0 and os.geteuid() == 0:  # no package lists yet (a fresh machine): once more after
            subprocess.run([apt, "update", "-q"], env=env, capture_output=True, text=True, timeout=600)
            get = subprocess.run([apt, "download", "-q", PACKAGE], cwd=work, env=env, capture_output=True, text=True,
                                 timeout=600)
        debs = sorted(Path(work).glob(f"{PACKAGE}_*.deb"))
        if get.returncode != 0 or not debs:
            pytest.fail(f"promtool: `apt-get download {PACKAGE}` failed: {(get.stderr or get.stdout).strip()[-500:]}")
        version = debs[0].name.split("_")[1]
        tar = subprocess.run([dpkg_deb, "--fsys-tarfile", str(debs[0])], capture_output=True, timeout=300)
        out = Path(work) / "promtool"
        unpack = subprocess.run(["tar", "-x", "-O", "./usr/bin/promtool"], input=tar.stdout, capture_output=True,
                                timeout=300)
        if tar.returncode != 0 or unpack.returncode != 0 or not unpack.stdout:
            pytest.fail(f"promtool: no usr/bin/promtool in {debs[0].name}: "
                        f"{(tar.stderr + unpack.stderr).decode()[-500:]}")
        out.write_bytes(unpack.stdout)
        out.chmod(0o755)
        target = _cache() / f"promtool-{version}"
        os.replace(out, target)  # atomically: a test process beside this one sees the whole binary or none
    return str(target)


def run(*args, cwd=None, stdin: str | None = None) -> subprocess.CompletedProcess:
    """promtool ARGS (text in and out)."""
    return subprocess.run([promtool(), *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120)


# --- the metric names a PromQL expression reads ------------------------------------------------------------------

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
             "inf", "nan"}


def metric_names(expr: str) -> set:
    """The metric names EXPR reads: its identifiers less string literals, label matchers and label lists,
    durations, Grafana's variables, function and aggregation names (an identifier followed by a parenthesis) and
    PromQL's keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", " ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\d+\w*", " ", text)
    text = re.sub(r"(?<![\w.])\d+(\.\d*)?([eE][+-]?\d+)?", " ", text)  # numbers (1e3's e3 is no name)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = match.group(0), text[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def health_names(text: str) -> set:
    """The metric names a health run's textfile (ladder/health.prometheus_text) declares (its TYPE lines)."""
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def series(text: str, prefix: str = "rigbook_") -> tuple:
    """({series: value}, {series: code}) of the samples named PREFIX... in TEXT (the text format, as a textfile
    holds it or node_exporter serves it, which sorts the labels): a series is its name and its labels sorted by name
    (`rigbook_layer_status{layer="pcie_link"}`), a failing or warning series' `code` label kept apart, so a series is
    found by its layer whatever its code."""
    values, codes = {}, {}
    for name, labels, value in re.findall(r"^(" + re.escape(prefix) + r"[^\s{]*)(?:\{(.*)\})? (\S+)$", text, re.M):
        pairs = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels or ""))
        code = pairs.pop("code", "")  # node_exporter gives every series of a family its labels: code="" on a pass
        inner = ",".join(f'{label}="{text}"' for label, text in sorted(pairs.items()))
        key = name + ("{" + inner + "}" if inner else "")
        if code:
            codes[key] = code
        values[key] = float(value)
    return values, codes


def families(text: str, prefix: str = "rigbook_") -> str:
    """The lines of TEXT (the text format) of the metric families named PREFIX...: their HELP, TYPE and samples."""
    return "".join(line + "\n" for line in text.splitlines()
                   if line.startswith(prefix) or line.startswith(("# HELP " + prefix, "# TYPE " + prefix)))
