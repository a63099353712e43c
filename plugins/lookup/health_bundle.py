# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
name: health_bundle
short_description: The path of rigbook-health.pyz, the health timer's program, built on the controller
description:
  - Builds the collection's module_utils into one zip Python runs (C(python3 rigbook-health.pyz --config FILE)),
    byte for byte reproducibly, named by its sha256, into C(health-bundle/) of the rigbook state directory
    (C(RIGBOOK_STATE_DIR), else C($XDG_STATE_HOME/rigbook), else C(~/.local/state/rigbook)); returns its path. The
    health role copies it to every box, where root's timer runs it.
  - The folder is made 0700; one that is a link, another user's or writable by group or others is refused (a lookup
    error saying why), as is such a state directory. A file at the bundle's name is returned only once its sha256 is
    the bundle's; a link there is removed, never followed. Nothing is built in the temporary directory.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Install the health timer's program
  ansible.builtin.copy:
    src: "{{ lookup('rigbook.homelab.health_bundle') }}"
    dest: /usr/local/lib/rigbook-health.pyz
    mode: "0644"
"""

RETURN = r"""
_raw:
  description: The path of the built rigbook-health.pyz on the controller (its sha256 checked to be the bundle's).
  type: list
  elements: path
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.rigbook.homelab.plugins.plugin_utils import health_bundle
from ansible_collections.rigbook.homelab.plugins.plugin_utils.private_folder import FolderRefused


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        module_utils = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
        try:
            return [health_bundle.bundle_path(module_utils)]
        except FolderRefused as exc:
            raise AnsibleLookupError("rigbook-health.pyz not built: %s" % exc) from exc
        except OSError as exc:
            raise AnsibleLookupError("cannot write rigbook-health.pyz: %s" % exc) from exc
