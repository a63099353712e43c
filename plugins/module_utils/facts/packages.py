# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Packages: the one reader of what dpkg has installed and of what apt could install (standard library only).

dpkg: DPKG_QUERY + names or patterns, `parse_listing` / `parse_installed` of its output, `listing` (version and
held) / `installed_versions` of named packages (deb_packages, rocm_check, adopt, the host manifest all read it
here; a recorded tree holds the same listing as its dpkg-query recording). apt: POLICY + names, `parse_policy` of
its output (installed version, candidate, the sources of the installed version), `candidates` of named packages.
Ubuntu drops superseded kernels from its archive: the headers of an older installed kernel then show
`Candidate: (none)`. RUN is a callable ARGV -> (rc, stdout) (facts/runner.rc_output on a box).
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner, text

PACKAGE = r"[a-z0-9][a-z0-9+.-]{0,127}"
VERSION = r"[A-Za-z0-9.+~:-]{1,128}"

# dpkg-query's listing, one package a line: name, status abbreviation (desired, status, error: "ii ", "hi ", "rc "),
# version. Followed by package names or glob patterns; without any it lists every package dpkg knows.
DPKG_QUERY = ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Version}\n"]
# apt's view of packages, followed by package names: installed version, candidate, version table.
POLICY = ["apt-cache", "policy"]
NONE = "(none)"


def parse_listing(output):
    """{package: {"version", "held"}} of the packages DPKG_QUERY's OUTPUT lists as installed: the status's second
    letter is "i" (ii, hi held; also ri/pi, a removal asked for but not done: the files are still there); held is
    the first letter "h". "rc" (configuration files left), "un" (unknown) and half-installed states are not
    installed. An architecture suffix (:amd64) is dropped; a line of another shape (name or version outside their
    character sets) is skipped."""
    found = {}
    for line in (output or "").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[1][1:2] != "i":
            continue
        name = text.matching(parts[0].split(":")[0], PACKAGE)
        version = text.matching(parts[2], VERSION)
        if name and version:
            found[name] = {"version": version, "held": parts[1][:1] == "h"}
    return found


def parse_installed(output):
    """{package: version} of the packages DPKG_QUERY's output lists as installed: the status's second letter is "i"
    (ii, hi held; also ri/pi, a removal asked for but not done: the files are still there). "rc" (configuration
    files left), "un" (unknown) and half-installed states are not installed. An architecture suffix (:amd64) is
    dropped; a line of another shape is skipped."""
    return dict((name, item["version"]) for name, item in parse_listing(output).items())


def listing(names, run=runner.rc_output):
    """{name: {"version", "held"} or None} of NAMES (package names or dpkg-query patterns) through RUN(argv) ->
    (rc, stdout); None: not installed or unknown to dpkg (dpkg-query then exits 1 but still lists the packages it
    knows). Without NAMES nothing is run. Patterns add every installed package they match."""
    out = dict((n, None) for n in names)
    if not names:
        return out
    _rc, stdout = run(DPKG_QUERY + list(names))
    out.update(parse_listing(stdout))
    return out


def installed_versions(names, run=runner.rc_output):
    """{name: version or None} of NAMES (package names or dpkg-query patterns) through RUN(argv) -> (rc, stdout):
    `listing` without the held flag."""
    return dict((name, item["version"] if item else None) for name, item in listing(names, run).items())


def parse_policy(text):
    """{package: {"installed", "candidate", "sources"}} from `apt-cache policy PKG ...`. installed and candidate are
    None where apt prints "(none)"; sources are those listed under the installed version (its version line starts
    with ***), e.g. ["500 http://deb.debian.org/debian bookworm/main amd64 Packages", "100 /var/lib/dpkg/status"].
    Version lines are indented by up to 5 spaces, their sources by 8. A package apt does not know at all is not
    listed (apt-cache prints nothing for it and says so on stderr)."""
    found, package, in_installed = {}, None, False
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            package = line.strip().rstrip(":")
            found[package] = {"installed": None, "candidate": None, "sources": []}
            in_installed = False
            continue
        if package is None:
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if stripped.startswith(("Installed:", "Candidate:")):
            key, value = stripped.split(":", 1)
            value = value.strip()
            found[package][key.lower()] = None if value == NONE or not value else value
        elif stripped.startswith("Version table:"):
            continue
        elif indent >= 8:
            if in_installed:
                found[package]["sources"].append(stripped)
        else:
            in_installed = stripped.startswith("*** ")
    return found


def candidates(names, run=runner.rc_output):
    """{name: candidate version or None} of NAMES through RUN(argv) -> (rc, stdout): None when apt has no
    installation candidate (the archive dropped it, or apt does not know the name). Without NAMES nothing is
    run. A failed apt-cache (rc != 0) raises RuntimeError: no candidate is never guessed from a broken apt."""
    out = dict((n, None) for n in names)
    if not names:
        return out
    rc, stdout = run(POLICY + list(names))
    if rc != 0:
        raise RuntimeError("%s exited %d" % (" ".join(POLICY + list(names)), rc))
    policy = parse_policy(stdout)
    for name in names:
        out[name] = (policy.get(name) or {}).get("candidate")
    return out
