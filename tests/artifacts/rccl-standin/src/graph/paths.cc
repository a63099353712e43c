// TEST STAND-IN for RCCL's src/graph/paths.cc (rigbook lab tests): NOT RCCL.
// ncclTopoCheckP2p has the shape of RCCL 2.27's: the P2P level starts at PATH_SYS, the user's level
// (NCCL_P2P_DISABLE / NCCL_P2P_LEVEL) is read, then the CPU defaults lower it to PATH_PXB on ARM, Intel
// and Zhaoxin hosts, and P2P is used when the GPUs' path type is within the level. The lines between the
// first comment below and the comparison are the same as upstream's, so the collection's
// p2p-level-user-last.patch applies to this file unchanged. Everything else is the stand-in's own code.
#include <cstdlib>
#include <cstring>

#include "topo.h"

const char* topoPathTypeStr[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS"};

// Legacy numeric levels 0-5 (the stand-in's own table, same meaning as NCCL's documented numbers).
static const int standinOldLevels[] = {PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB, PATH_SYS, PATH_SYS};

static int standinLevelOf(const char* text) {
  for (int i = 0; i <= PATH_SYS; i++) {
    if (strcmp(text, topoPathTypeStr[i]) == 0) return i;
  }
  if (text[0] >= '0' && text[0] <= '9') {
    long old = strtol(text, NULL, 10);
    if (old > 5) old = 5;
    return standinOldLevels[old];
  }
  return -1;
}

// -1: not read yet; -2: read, the user set nothing.
static int ncclTopoUserP2pLevel = -1;

ncclResult_t ncclGetUserP2pLevel(int* level) {
  if (ncclTopoUserP2pLevel == -1) {
    int found = -2;
    const char* disable = ncclGetEnv("NCCL_P2P_DISABLE");
    if (disable && strtol(disable, NULL, 0) == 1) {
      found = PATH_LOC;
      INFO(NCCL_ALL, "NCCL_P2P_DISABLE set by environment to 1");
    } else {
      const char* text = ncclGetEnv("NCCL_P2P_LEVEL");
      int parsed = text ? standinLevelOf(text) : -1;
      if (parsed >= 0) {
        found = parsed;
        INFO(NCCL_ALL, "NCCL_P2P_LEVEL set by environment to %s", topoPathTypeStr[parsed]);
      }
    }
    ncclTopoUserP2pLevel = found;
  }
  if (ncclTopoUserP2pLevel != -2) *level = ncclTopoUserP2pLevel;
  return ncclSuccess;
}

ncclResult_t ncclTopoCheckP2p(struct ncclComm* comm, struct ncclTopoSystem* system, int rank1, int rank2, int* p2p,
                              int* read, int* intermediateRank, int* cudaP2p) {
  (void)comm;
  *p2p = 0;
  if (read) *read = 0;
  if (intermediateRank) *intermediateRank = -1;
  if (cudaP2p) *cudaP2p = 0;
  if (rank1 < 0 || rank2 < 0 || rank1 >= system->nodes[GPU].count || rank2 >= system->nodes[GPU].count) {
    return ncclInternalError;
  }
  struct ncclTopoNode* gpu1 = system->nodes[GPU].nodes + rank1;
  struct ncclTopoLinkList* path = gpu1->paths[GPU] + rank2;

  // In general, use P2P whenever we can.
  int p2pLevel = PATH_SYS;

  // User override
  NCCLCHECK(ncclGetUserP2pLevel(&p2pLevel));

  // Don't use P2P through ARM CPUs
  int arch, vendor, model;
  NCCLCHECK(ncclTopoCpuType(system, &arch, &vendor, &model));
  if (arch == NCCL_TOPO_CPU_ARCH_ARM) p2pLevel = PATH_PXB;
  if (arch == NCCL_TOPO_CPU_ARCH_X86 && vendor == NCCL_TOPO_CPU_VENDOR_INTEL) {
    p2pLevel = PATH_PXB;
  }
  if (arch == NCCL_TOPO_CPU_ARCH_X86 && vendor == NCCL_TOPO_CPU_VENDOR_ZHAOXIN) {
    p2pLevel = PATH_PXB;
  }

  // Compute the PCI distance and compare with the p2pLevel.
  if (path->type <= p2pLevel) *p2p = 1;
  if (cudaP2p) *cudaP2p = 1;
  return ncclSuccess;
}
