# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    """Where a module reads the hardware facts, and the host model it judges them against."""

    DOCUMENTATION = r"""
options:
  root:
    description: Evidence root; V(/) on a real box, a recorded tree on a lab host or in a replay (docs/evidence.md).
    type: path
    default: /
"""

    HOST = r"""
options:
  host:
    description:
      - "The host model, C(rigbook_host) (plugins/module_utils/host_model.py; the preflight role sets it). The
        judges read its GPUs, P2P expectation, pins and tolerance."
    type: dict
    default: {}
"""
