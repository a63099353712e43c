#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: host_model
short_description: Compute the host model (rigbook_host) after checking the host's rigbook_* variables
description:
  - Computes the host model (plugins/module_utils/host_model.py) - what the host is, every default decided once - and
    returns it as RV(host_model), with C(readiness) per role; the preflight role sets it as the fact C(rigbook_host),
    which every role, module and judge reads. Fails, before any role has changed anything, when a role this run
    applies (its C(--tags) and C(--skip-tags) considered, and O(roles)) lacks an input.
  - First checks the host's merged C(rigbook_*) variables (C(rigbook_gpu), C(rigbook_p2p), C(rigbook_pins), C(rigbook_serve),
    C(rigbook_tolerance), C(rigbook_evidence_root)) against C(meta/host_vars.schema.json), the same file and wording as
    C(provision validate).
  - Fails naming each key path, the bad value and what is allowed. Unknown C(rigbook_*) names are errors.
  - An action plugin - runs on the controller only, contacts no host. Needs the Python package jsonschema on the
    controller.
  - Extra variables (C(-e)) and the variables the collection's plays set themselves are not checked.
  - With O(secure_boot) (the preflight role's second call, after M(rigbook.homelab.boot_state) read the box) it fails,
    before any package changes, naming what the roles of this run need of the box's Secure Boot - the DKMS signing
    key enrolled (C(mokutil --import), confirmed at the console), a kernel the owner built signed by a key shim
    trusts; the host model is read from C(rigbook_host) (docs/secure-boot.md).
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  roles:
    description: The roles of the play whose inputs are checked; omitted - every role site.yml applies to the host.
    type: list
    elements: str
  secure_boot:
    description:
      - The box's Secure Boot as M(rigbook.homelab.boot_state) returns it (its return value C(secure_boot)).
        Given, only the Secure Boot needs are checked.
    type: dict
  running_kernel:
    description: The running kernel's release (boot_state's C(running)); a kernel already running with Secure Boot on
      is signed by a key shim trusts.
    type: str
attributes:
  action:
    support: full
    description: Runs on the controller only.
  check_mode:
    support: full
    description: Checks the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Check the rigbook_* variables and compute the host model before touching the host
  rigbook.homelab.host_model:
  register: preflight_model

- name: Set the host model
  ansible.builtin.set_fact:
    rigbook_host: "{{ preflight_model.host_model }}"
"""

RETURN = r"""
checked:
  description: The rigbook_* variable names checked.
  returned: when the variables could be read
  type: list
  elements: str
problems:
  description: "Each problem found: C({key_path, message}); empty when the variables are valid."
  returned: when the variables could be read
  type: list
  elements: dict
notes:
  description: With O(secure_boot), what was found fine (Secure Boot off, the DKMS signing key enrolled, ...).
  returned: with O(secure_boot)
  type: list
  elements: str
host_model:
  description: The host model, with C(readiness) ({role - [need]}).
  returned: when the variables are valid and every role of this run has its inputs
  type: dict
"""
