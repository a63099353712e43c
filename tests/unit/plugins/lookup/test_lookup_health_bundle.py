"""lookup/health_bundle.py: the path of rigbook-health.pyz, and a temporary directory that refuses the file said as
a lookup error."""

from __future__ import annotations

import os

import pytest

from rigbook.paths import link_collection

link_collection()
from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.lookup import health_bundle as lookup  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.plugin_utils import health_bundle  # noqa: E402


def test_the_lookup_returns_the_built_bundles_path_and_says_why_it_cannot(tmp_path, monkeypatch):
    monkeypatch.setattr(health_bundle.tempfile, "gettempdir", lambda: str(tmp_path))
    [path] = lookup.LookupModule().run([])
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("rigbook-health-")
    os.unlink(path)
    os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(AnsibleLookupError, match="cannot write rigbook-health.pyz: .*symbolic link"):
        lookup.LookupModule().run([])
    assert not (tmp_path / "elsewhere").exists()
