// TEST STAND-IN for RCCL's init (rigbook lab tests): NOT RCCL. It builds the topology from the evidence tree
// (RIGBOOK_EVIDENCE_ROOT, default "/": the PCI functions of sysfs and the CPU vendor), asks ncclTopoCheckP2p
// for each GPU pair, and logs like RCCL with NCCL_DEBUG=INFO: the version, the P2P level read from the
// environment, isAllDirectP2p and each channel's transport (P2P/IPC or SHM/direct/direct). Moves no data.
#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "rccl.h"
#include "topo.h"

namespace fs = std::filesystem;

const char* ncclGetEnv(const char* name) { return getenv(name); }

static bool standinDebug() {
  const char* level = getenv("NCCL_DEBUG");
  return level && (strcasecmp(level, "INFO") == 0 || strcasecmp(level, "TRACE") == 0);
}

static int standinRank = 0;

void standinInfo(const char* fmt, ...) {
  if (!standinDebug()) return;
  char host[64] = "localhost";
  gethostname(host, sizeof(host) - 1);
  printf("%s:%d:%d [%d] NCCL INFO ", host, (int)getpid(), (int)getpid(), standinRank);
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
}

static std::string readText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

static std::string trim(const std::string& text) {
  size_t a = text.find_first_not_of(" \t\n"), b = text.find_last_not_of(" \t\n");
  return a == std::string::npos ? "" : text.substr(a, b - a + 1);
}

ncclResult_t ncclTopoCpuType(struct ncclTopoSystem* system, int* arch, int* vendor, int* model) {
  *arch = system->cpuArch;
  *vendor = system->cpuVendor;
  *model = 0;
  return ncclSuccess;
}

// The GPUs (display-class PCI functions) under ROOT/sys/bus/pci/devices, their upstream ports and PCI roots;
// the CPU vendor from ROOT/proc/cpuinfo, else from the host bridge at 0000:00:00.0 (a recorded tree has no
// cpuinfo). Path type per pair: same port PIX, same PCI root PHB, else SYS.
ncclResult_t ncclTopoGetSystem(const std::string& root, struct ncclTopoSystem* system) {
  system->nodes[GPU].count = 0;
  system->cpuArch = NCCL_TOPO_CPU_ARCH_X86;
  system->cpuVendor = 0;
  fs::path devices = fs::path(root) / "sys/bus/pci/devices";
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(devices, ec)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    std::string cls = trim(readText(devices / name / "class"));
    if (cls.rfind("0x03", 0) != 0) continue;
    if (system->nodes[GPU].count >= NCCL_TOPO_MAX_GPUS) break;
    fs::path real = fs::canonical(devices / name, ec);
    if (ec) continue;
    struct ncclTopoNode* node = system->nodes[GPU].nodes + system->nodes[GPU].count++;
    node->busId = name;
    node->port = real.parent_path().filename();
    fs::path up = real;
    while (up.has_parent_path() && up.filename().string().rfind("pci", 0) != 0 && up != up.root_path()) {
      up = up.parent_path();
    }
    node->root = up.filename();
  }
  std::string cpuinfo = readText(fs::path(root) / "proc/cpuinfo");
  std::string bridgeVendor = trim(readText(devices / "0000:00:00.0" / "vendor"));
  if (cpuinfo.find("GenuineIntel") != std::string::npos || (cpuinfo.empty() && bridgeVendor == "0x8086")) {
    system->cpuVendor = NCCL_TOPO_CPU_VENDOR_INTEL;
  } else if (cpuinfo.find("AuthenticAMD") != std::string::npos || (cpuinfo.empty() && bridgeVendor == "0x1022")) {
    system->cpuVendor = NCCL_TOPO_CPU_VENDOR_AMD;
  }
  int n = system->nodes[GPU].count;
  for (int i = 0; i < n; i++) {
    struct ncclTopoNode* a = system->nodes[GPU].nodes + i;
    a->paths[GPU] = a->pathStore;
    for (int j = 0; j < n; j++) {
      struct ncclTopoNode* b = system->nodes[GPU].nodes + j;
      int type = i == j ? PATH_LOC : a->port == b->port ? PATH_PIX : a->root == b->root ? PATH_PHB : PATH_SYS;
      a->pathStore[j].type = type;
      a->pathStore[j].count = i == j ? 0 : 2;
    }
  }
  return ncclSuccess;
}

static struct ncclTopoSystem standinSystem;

extern "C" ncclResult_t ncclGetVersion(int* version) {
  *version = 22707;
  return ncclSuccess;
}

extern "C" const char* rcclStandinGpuTargets(void) { return RCCL_STANDIN_TARGETS; }

extern "C" int rcclStandinP2p(ncclComm_t comm) { return comm ? comm->p2p : 0; }

extern "C" ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  (void)devlist;
  const char* root = getenv("RIGBOOK_EVIDENCE_ROOT");
  INFO(NCCL_ALL, "NCCL version %s+hip (rigbook TEST STAND-IN, targets %s)", RCCL_STANDIN_VERSION, RCCL_STANDIN_TARGETS);
  NCCLCHECK(ncclTopoGetSystem(root && *root ? root : "/", &standinSystem));
  if (standinSystem.nodes[GPU].count < ndev) {
    fprintf(stderr, "rccl stand-in: %d GPUs asked, %d found under %s/sys/bus/pci/devices\n", ndev,
            standinSystem.nodes[GPU].count, root ? root : "");
    return ncclInternalError;
  }
  int all = 1;
  for (int i = 0; i < ndev; i++) {
    for (int j = 0; j < ndev; j++) {
      if (i == j) continue;
      int p2p = 0;
      NCCLCHECK(ncclTopoCheckP2p(NULL, &standinSystem, i, j, &p2p, NULL, NULL, NULL));
      all &= p2p;
    }
  }
  INFO(NCCL_ALL, "Check P2P Type isAllDirectP2p %d directMode 0", all);
  for (int r = 0; r < ndev; r++) {
    comms[r] = new ncclComm{r, ndev, all, &standinSystem};
    standinRank = r;
    for (int c = 0; c < 2; c++) {
      INFO(NCCL_ALL, "Channel %02d/0 : %d[%d] -> %d[%d] via %s", c, r, r, (r + 1) % ndev, (r + 1) % ndev,
           all ? "P2P/IPC" : "SHM/direct/direct");
    }
  }
  standinRank = 0;
  INFO(NCCL_ALL, "Connected all rings");
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
