#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: cuda_toolchain_check
short_description: Check a pip-installed CUDA toolchain - aligned versions, lib64 link - and compile and link a .cu
description:
  - Reads the installed versions of the CUDA wheels in the venv's site-packages (their dist-info) and fails when
    nvcc, crt and nvvm differ from each other or from O(expected), naming every version found (mismatches give
    the CCCL C(#error) and the C(PTX .version) failures of a hand-mixed toolchain).
  - Compiles and links a small .cu file with the venv's nvcc for O(arch) (no GPU needed) and fails with the
    compiler's output when that does not work. The check is repeated whenever the versions differ from the
    last successful check (recorded in O(stamp)); otherwise it is not re-run.
  - Supports check mode (reads only, compiles nothing).
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  venv:
    description: The virtual environment holding the CUDA wheels.
    type: path
    required: true
  expected:
    description: Package name -> pinned version.
    type: dict
    required: true
  aligned:
    description: Packages that must all have one version.
    type: list
    elements: str
    default: [nvidia-cuda-nvcc, nvidia-cuda-crt, nvidia-nvvm]
  arch:
    description: GPU architecture to compile for (nvcc -arch).
    type: str
    default: sm_86
  stamp:
    description: Where the versions of the last successful compile-and-link check are kept.
    type: path
    required: true
  compile:
    description: V(false) only reads the installed versions (before installing); V(true) checks them and compiles.
    type: bool
    default: true
extends_documentation_fragment:
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Check the toolchain
  rigbook.homelab.cuda_toolchain_check:
    venv: /opt/rigbook/cuda
    expected: {nvidia-cuda-nvcc: 13.0.88, nvidia-cuda-crt: 13.0.88, nvidia-nvvm: 13.0.88}
    stamp: /opt/rigbook/cuda/.rigbook-compile-check
"""

RETURN = r"""
versions:
  description: Package -> installed version (null when missing).
  returned: always
  type: dict
cuda_home:
  description: The toolkit root inside site-packages (nvidia/cuNN).
  returned: when found
  type: str
compiled:
  description: Whether this call compiled and linked the test program.
  returned: always
  type: bool
"""

import glob
import os
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner

TEST_CU = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void add(int *out, int a, int b) { *out = a + b; }
int main() {
    int *d = nullptr;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) { std::printf("no device (expected without a GPU)\n"); return 0; }
    add<<<1, 1>>>(d, 2, 3);
    int h = 0;
    cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    std::printf("%d\n", h);
    return h == 5 ? 0 : 1;
}
"""


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(site):
    found = {}
    for info in glob.glob(os.path.join(site, "*.dist-info")):
        m = re.match(r"^(.+?)-([^-]+)\.dist-info$", os.path.basename(info))
        if m:
            found[norm(m.group(1))] = m.group(2)
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            expected=dict(type="dict", required=True),
            aligned=dict(type="list", elements="str", default=["nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"]),
            arch=dict(type="str", default="sm_86"),
            stamp=dict(type="path", required=True),
            compile=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    sites = sorted(glob.glob(os.path.join(p["venv"], "lib", "python*", "site-packages")))
    if not sites:
        if module.check_mode or not p["compile"]:
            module.exit_json(changed=module.check_mode and p["compile"], versions={}, compiled=False,
                             msg="no venv at %s yet" % p["venv"])
        module.fail_json(msg="no venv site-packages under %s" % p["venv"])
    found = installed(sites[-1])
    versions = dict((name, found.get(norm(name))) for name in p["expected"])
    result = dict(changed=False, versions=versions, compiled=False)
    if not p["compile"]:
        module.exit_json(**result)
    aligned = dict((n, versions.get(n, found.get(norm(n)))) for n in p["aligned"])
    listing = ", ".join("%s %s" % (n, v or "missing") for n, v in sorted(aligned.items()))
    if len(set(aligned.values())) > 1:
        module.fail_json(msg="CUDA toolchain versions differ: %s. nvcc, crt and nvvm must be one release "
                             "(a mix gives CCCL #error and PTX .version failures); pin all three to one version"
                         % listing, **result)
    wrong = ["%s %s (pinned %s)" % (n, versions[n] or "missing", want)
             for n, want in sorted(p["expected"].items()) if versions[n] != str(want)]
    if wrong:
        if module.check_mode:
            module.exit_json(changed=True, msg="would reinstall: " + "; ".join(wrong), **result)
        module.fail_json(msg="CUDA wheels not as pinned: " + "; ".join(wrong), **result)
    homes = sorted(glob.glob(os.path.join(sites[-1], "nvidia", "cu[0-9]*")))
    if not homes or not os.path.isfile(os.path.join(homes[-1], "bin", "nvcc")):
        module.fail_json(msg="no nvcc under %s/nvidia/cu*/bin" % sites[-1], **result)
    home = homes[-1]
    result["cuda_home"] = home
    wanted_stamp = "%s arch=%s\n" % (" ".join("%s=%s" % kv for kv in sorted(versions.items())), p["arch"])
    if files.read_text(p["stamp"], strip=False) == wanted_stamp:
        module.exit_json(**result)
    result["changed"] = True
    if module.check_mode:
        module.exit_json(msg="would compile and link a test .cu", **result)
    work = tempfile.mkdtemp(prefix="rigbook-nvcc-")
    try:
        with open(os.path.join(work, "t.cu"), "w") as handle:
            handle.write(TEST_CU)
        env = dict(CUDA_HOME=home, CUDA_PATH=home, PATH="%s/bin:%s" % (home, os.environ.get("PATH", "/usr/bin:/bin")))
        argv = [os.path.join(home, "bin", "nvcc"), "-arch=" + p["arch"], "-o", "t", "t.cu"]
        ran = runner.run(argv, cwd=work, env=env)
        if ran.rc != 0 or not os.path.isfile(os.path.join(work, "t")):
            said = (ran.stderr or ran.stdout) if ran.rc is not None else ran.error
            module.fail_json(msg="nvcc could not compile and link a test .cu (%s): %s" % (listing, said[-3000:]),
                             cmd=argv, **result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    try:
        files.write_atomic(p["stamp"], wanted_stamp)
    except OSError as exc:
        module.fail_json(msg="nvcc compiled and linked a test .cu, but its stamp %s cannot be written: %s"
                         % (p["stamp"], exc), **result)
    result["compiled"] = True
    module.exit_json(msg="nvcc compiled and linked a test .cu for %s (%s)" % (p["arch"], listing), **result)


if __name__ == "__main__":
    main()
