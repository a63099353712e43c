// SPDX-License-Identifier: GPL-2.0
/*
 * TEST ARTIFACT (rigbook): a stand-in for the NVIDIA P2P driver fork, used by the lab tests so that
 * real DKMS builds and installs a real out-of-tree module named "nvidia" for real Debian kernels.
 * It drives no hardware and is never loaded by the tests (lab hosts share the machine's kernel).
 */
#include <linux/module.h>
#include <linux/init.h>

static int __init standin_init(void)
{
	pr_info("rigbook nvidia stand-in loaded (test artifact, drives nothing)\n");
	return 0;
}

static void __exit standin_exit(void)
{
}

module_init(standin_init);
module_exit(standin_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION("615.71.09");
MODULE_DESCRIPTION("rigbook TEST STAND-IN for the NVIDIA P2P fork (not a driver)");
