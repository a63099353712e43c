"""Build hook (metadata is in pyproject.toml): a built wheel carries the Ansible collection rigbook.homelab.

build_py copies the collection's runtime files from the checkout root into the wheel as rigbook/collection/, where
rigbook.paths.collection_root() finds them after a plain `pip install .` (or of the wheel). An editable install
(`pip install -e .`) copies nothing: collection_root() finds the checkout itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# What playbooks, roles, the CLI and the lab read at run time (paths relative to the checkout root). tests/artifacts
# holds the lab's driver stand-ins (src/rigbook/lab/artifacts.py packs them).
COLLECTION = ["galaxy.yml", "README.md", "meta", "plugins", "roles", "playbooks", "inventory", "references",
              "tests/artifacts"]
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".*")


def copy_collection(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    for name in COLLECTION:
        source = ROOT / name
        if not source.exists():
            raise SystemExit(f"setup.py: the collection's {name} is missing from {ROOT}")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=SKIP)
        else:
            shutil.copy2(source, target)


class build_py_with_collection(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            copy_collection(Path(self.build_lib) / "rigbook" / "collection")


setup(cmdclass={"build_py": build_py_with_collection})
