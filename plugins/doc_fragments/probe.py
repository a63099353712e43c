# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment:
    """The GPU probe's options, shared by the modules that run it (peer_access, p2p_bandwidth, runtime_ladder)."""

    DOCUMENTATION = r"""
options:
  size_bytes:
    description: Bytes per probe copy.
    type: int
    default: 67108864
  reps:
    description: Timed probe copies per figure.
    type: int
    default: 10
  deadline_s:
    description: Soft time budget of the probe (10 s for CUDA, 20 s for HIP when omitted); it is killed 30 s later.
    type: float
  ipc_legacy:
    description:
      - AMD only. HSA_ENABLE_IPC_MODE_LEGACY for the probe and its IPC child (true = C(1), false = C(0), DMA-BUF).
      - Defaults to the value pinned in C(pins.rocm.hsa_env), else the environment's.
    type: bool
"""
