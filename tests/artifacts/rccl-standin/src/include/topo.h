// TEST STAND-IN (rigbook lab tests): the few topology types the stand-in's paths.cc needs, with NCCL's
// path type numbering. Not RCCL's headers.
#ifndef RCCL_STANDIN_TOPO_H
#define RCCL_STANDIN_TOPO_H

#include <string>
#include <vector>

typedef int ncclResult_t;
#define ncclSuccess 0
#define ncclInternalError 3
#define NCCLCHECK(call) do { ncclResult_t res_ = (call); if (res_ != ncclSuccess) return res_; } while (0)

enum { PATH_LOC = 0, PATH_NVL, PATH_NVB, PATH_C2C, PATH_PIX, PATH_PXB, PATH_P2C, PATH_PXN, PATH_PHB, PATH_SYS,
       PATH_NET, PATH_DIS };
extern const char* topoPathTypeStr[];

#define NCCL_TOPO_CPU_ARCH_X86 1
#define NCCL_TOPO_CPU_ARCH_ARM 3
#define NCCL_TOPO_CPU_VENDOR_INTEL 1
#define NCCL_TOPO_CPU_VENDOR_AMD 2
#define NCCL_TOPO_CPU_VENDOR_ZHAOXIN 3

enum { GPU = 0, NCCL_TOPO_NODE_TYPES = 1 };
#define NCCL_TOPO_MAX_GPUS 8

struct ncclTopoLinkList { int type; int count; };
struct ncclTopoNode {
  std::string busId;
  std::string port;  // the upstream port (parent directory in sysfs)
  std::string root;  // the PCI root (pci0000:00)
  struct ncclTopoLinkList* paths[NCCL_TOPO_NODE_TYPES];
  struct ncclTopoLinkList pathStore[NCCL_TOPO_MAX_GPUS];
};
struct ncclTopoNodeSet { int count; struct ncclTopoNode nodes[NCCL_TOPO_MAX_GPUS]; };
struct ncclTopoSystem { struct ncclTopoNodeSet nodes[NCCL_TOPO_NODE_TYPES]; int cpuArch; int cpuVendor; };
struct ncclComm { int rank; int nRanks; int p2p; struct ncclTopoSystem* topo; };

void standinInfo(const char* fmt, ...);
#define INFO(flags, ...) standinInfo(__VA_ARGS__)
#define NCCL_ALL 0
const char* ncclGetEnv(const char* name);
ncclResult_t ncclTopoCpuType(struct ncclTopoSystem* system, int* arch, int* vendor, int* model);
ncclResult_t ncclTopoGetSystem(const std::string& root, struct ncclTopoSystem* system);
ncclResult_t ncclGetUserP2pLevel(int* level);
ncclResult_t ncclTopoCheckP2p(struct ncclComm* comm, struct ncclTopoSystem* system, int rank1, int rank2, int* p2p,
                              int* read, int* intermediateRank, int* cudaP2p);
#endif
