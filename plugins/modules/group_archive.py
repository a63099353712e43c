#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: group_archive
short_description: The controller's side of a group build - who builds, what is recorded, what a twin may install
description:
  - An action plugin (plugins/action/group_archive.py) - runs on the controller only, contacts no host. roles/group_build
    calls it; it is not meant for plays of its own.
  - The controller hashes and lists every build archive it fetches itself and keeps a provenance record beside it in
    O(builds_dir) (the box that built it, its inventory groups, the inventory, the run, the identity, the sha256 and
    every file with its sha256). A box installs an archive only when it is of the same inventory and groups as its
    builder and the archive still has the recorded sha256, and only the recorded files (the modules' install_files).
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  step:
    description:
      - C(plan) this box's part (build, verify, install or own); C(record) the builder's fetched archive; C(verify) a
        second box's own build against the recorded one (fails on a differing sha256); C(take) the archive an
        installing box may use, with its install_files.
    type: str
    required: true
    choices: [plan, record, verify, take]
  name:
    description: The build's name (the module's name argument, e.g. rccl).
    type: str
    required: true
  builds_dir:
    description: The controller's builds folder (provision passes the state directory's builds/).
    type: path
    required: true
  state_var:
    description: The variable the including role registered its check result under (plan, record).
    type: str
  verify:
    description: With plan - a second due box of the group builds too (rigbook_verify_builds).
    type: bool
    default: false
  plan:
    description: This box's registered plan step result (record, verify, take).
    type: dict
  claimed_sha256:
    description: With record - the sha256 the builder said its archive has; the controller's own hash decides.
    type: str
attributes:
  action:
    support: full
    description: Runs on the controller only.
  check_mode:
    support: full
    description: Plans and checks in check mode; records nothing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Plan this box's part in the group's build
  rigbook.homelab.group_archive:
    step: plan
    name: rccl
    state_var: rccl_state
    builds_dir: "{{ rigbook_builds_dir }}"
  register: group_build_plan
"""

RETURN = r"""
part:
  description: With plan - build, verify, install or own.
  returned: plan
  type: str
why:
  description: Each archive of this build in builds/ that is not used, and why.
  returned: plan, take
  type: list
  elements: str
use:
  description: With take - whether an archive is installed here (false - the box builds its own).
  returned: take
  type: bool
install_files:
  description: With take - the recorded files, relative path to sha256.
  returned: take
  type: dict
"""
