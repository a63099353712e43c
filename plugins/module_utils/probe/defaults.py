# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The probe's default sizes, apart from the engine so the ladder's options can name them without loading it."""

from __future__ import annotations

DEFAULT_SIZE = 64 << 20  # bytes per probe copy
DEFAULT_REPS = 10  # timed copies per figure
DEFAULT_DEADLINE_S = 10.0  # soft time budget of a CUDA probe
