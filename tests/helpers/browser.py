"""A real headless browser (Debian's chromium) with the network off: `chromium()` (installed when missing, else a
skip), `browse()` a page, `page_dom()` (the DOM chromium built, searchable by tag and attributes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.report import html_elements

# --- a real headless browser (Debian's chromium) with the network off ------------------------------------------

OFFLINE = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--no-pings",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-domain-reliability", "--no-first-run", "--no-default-browser-check"]


def chromium() -> str:
    """The chromium binary, installed with apt-get when missing (root on Debian), else a skip saying what to do."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    apt = shutil.which("apt-get")
    if not apt or os.geteuid() != 0:
        pytest.skip("needs Debian's chromium package: `apt-get install chromium` as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [apt, "install", "-y", "--no-install-recommends", "chromium"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        subprocess.run([apt, "update"], env=env, capture_output=True, text=True, timeout=600)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    assert result.returncode == 0 and found, (result.stderr or result.stdout)[-2000:]
    return found


def browse(binary: str, page: Path, profile: Path, *args) -> subprocess.CompletedProcess:
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={profile}", *OFFLINE, *args, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=profile)


def page_dom(page: Path, profile: Path):
    """Chromium's DOM of PAGE, the network off: find(tag, **attrs) over its elements (data_host= is data-host=,
    class_= is class=)."""
    dumped = browse(chromium(), page, profile, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    elements, _ = html_elements(dumped.stdout)

    def find(tag, **attrs):
        return [e for e in elements if e["tag"] == tag
                and all(e.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]
    return find
