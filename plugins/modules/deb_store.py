#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: deb_store
short_description: The controller's store of a pinned distribution kernel's .debs - what it holds, what a box installs
description:
  - An action plugin (plugins/action/deb_store.py) - runs on the controller only, contacts no host. roles/kernel calls
    it; it is not meant for plays of its own.
  - Ubuntu drops a kernel's packages from its archive once a newer ABI of the series is published. The first box that
    installs the pinned distribution kernel keeps the .debs apt downloaded (rigbook.homelab.deb_packages, O(step=plan)
    says which); the controller hashes each fetched file itself and stores it under that sha256 only when it is the
    one the package index names for that version (C(apt-cache show) on the box); a later box installs those exact
    files when the archive no longer offers the recorded version.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  step:
    description:
      - C(plan) the packages the release is installed as on the box's OS, the patterns of those whose .debs are kept,
        the store's records of the release and where the box's fetched .debs land; C(record) the .debs a box kept
        (fails on a file whose sha256 is not the index's); C(take) the stored files of O(names), each re-hashed.
    type: str
    required: true
    choices: [plan, record, take]
  release:
    description: The pinned kernel release (uname -r), e.g. 7.0.0-31-generic.
    type: str
    required: true
  store_dir:
    description: The controller's store folder (the kernel role passes the state directory's builds/debs); without it
      (O(step=plan) only) nothing is kept or stored.
    type: path
  os_id:
    description: With plan - the box's OS (the host model's os.id); on V(ubuntu) modules and modules-extra come with
      the kernel.
    type: str
  packages:
    description: With plan - the pinned package names (image and headers by default).
    type: list
    elements: str
  architecture:
    description: With record and take - the box's dpkg architecture (deb_packages returns it).
    type: str
  kept:
    description: With record - deb_packages' C(kept) list, each fetched to the
      plan's incoming folder as N.deb (N its index in the list).
    type: list
    elements: dict
  names:
    description: With take - the packages to install from the store (deb_packages' from_store).
    type: list
    elements: str
  dest_dir:
    description: With take - where the box keeps the copied files.
    type: path
attributes:
  action:
    support: full
    description: Runs on the controller only.
  check_mode:
    support: full
    description: Plans and takes in check mode; records nothing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Read the kernel's packages and the controller's store of its .debs
  rigbook.homelab.deb_store:
    step: plan
    release: 7.0.0-31-generic
    os_id: ubuntu
    packages: [linux-image-7.0.0-31-generic, linux-headers-7.0.0-31-generic]
    store_dir: "{{ rigbook_builds_dir }}/debs"
  register: kernel_store
"""

RETURN = r"""
packages:
  description: With plan - the packages the release is installed as.
  returned: plan
  type: list
  elements: str
keep:
  description: With plan - dpkg-query patterns of the installed packages whose .debs are kept (none without store_dir).
  returned: plan
  type: list
  elements: str
records:
  description: With plan and record - the store's records of the release (release, architecture, each package's
    version, architecture and sha256).
  returned: plan, record
  type: list
  elements: dict
incoming:
  description: With plan - where this box's fetched .debs land on the controller.
  returned: plan
  type: str
stored:
  description: With record - the packages stored by this step.
  returned: record
  type: list
  elements: str
files:
  description: With take - each stored file to copy (src on the controller, path on the box, sha256).
  returned: take
  type: list
  elements: dict
artifacts:
  description: With take - each copied file's path on the box and sha256 (for rigbook.homelab.artifact).
  returned: take
  type: list
  elements: dict
why:
  description: What was not used or not stored, and why (also as warnings).
  returned: plan, record
  type: list
  elements: str
"""
