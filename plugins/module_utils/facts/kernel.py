# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel: the running release, its command line and the words of it every boot has (standard library only).

The release is /proc/sys/kernel/osrelease and the command line /proc/cmdline under the evidence root. The
boot-only words (BOOT_WORDS, and the parameters named in BOOT_KEYS) are what every boot has - the image, the root
disk, quiet - and never a pin: `own_words` is the rest, the box owner's own choice (iommu=pt, pcie_acs_override=...),
up to "--" (what follows goes to init). HOST_KEYS name this host's own disks: a twin has its own.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, text

RELEASE = r"[A-Za-z0-9._+~-]{1,128}"
BOOT_WORDS = frozenset(("ro", "rw", "quiet", "splash", "$vt_handoff", "nosplash"))
BOOT_KEYS = frozenset(("BOOT_IMAGE", "root", "resume", "initrd", "rootflags", "rootfstype", "cryptdevice",
                       "rd.luks.uuid", "vt.handoff"))
HOST_KEYS = ("root", "resume", "cryptdevice", "rd.luks.uuid")
MAX_WORD = 1024
MAX_WORDS = 256


def parse_release(value):
    """A kernel release (6.8.0-90-generic), or None for text of another shape."""
    return text.matching(value, RELEASE)


def release(root):
    """The running kernel's release under ROOT, or None."""
    return parse_release(files.read_text(files.path(root, "proc", "sys", "kernel", "osrelease"), limit=4096))


def parse_cmdline(value):
    """The words of a kernel command line (bounded in count and length), or None for None."""
    if value is None:
        return None
    words = text.bounded(value, MAX_WORD * MAX_WORDS).split()
    return [word[:MAX_WORD] for word in words[:MAX_WORDS]]


def cmdline(root):
    """The running kernel's command line under ROOT as words, or None when it cannot be read."""
    return parse_cmdline(files.read_text(files.path(root, "proc", "cmdline"), limit=MAX_WORD * MAX_WORDS))


def key_of(word):
    return word.split("=", 1)[0]


def is_boot_only(word):
    """True for a word every boot has (the image, the root disk, quiet): never a pin."""
    return word in BOOT_WORDS or key_of(word) in BOOT_KEYS


def own_words(words):
    """The words of a command line (a list, or the text) that are the box's own choice, up to "--"."""
    if isinstance(words, str):
        words = parse_cmdline(words)
    own = []
    for word in words or []:
        if word == "--":
            break
        if not is_boot_only(word):
            own.append(word)
    return own


def host_words(words):
    """The words naming this host's own disks (root=, resume=, ...): a twin has its own."""
    return [word for word in words or [] if key_of(word) in HOST_KEYS]
