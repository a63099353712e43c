// TEST STAND-IN for an nccl-tests program (rigbook lab tests): NOT nccl-tests, moves no data (the lab has no GPU).
// Takes nccl-tests' flags (-b -e -f -g -n -w), asks the NCCL it was linked against for its version (ncclGetVersion:
// the real pip wheel's libnccl in the lab), and prints nccl-tests' table with figures read from the evidence tree
// under RIGBOOK_EVIDENCE_ROOT: when the recorded NCCL log goes through P2P (and NCCL_P2P_DISABLE is not 1), the
// recorded collectives figures; otherwise the recorded host-staged copy rate (cuda-probe.json), which is what SHM
// moves at. With NCCL_DEBUG=INFO it prints NCCL's version line from the real library, then the recorded log lines.
#include <unistd.h>

#include "nccl.h"
#include "perf_table.h"

int main(int argc, char** argv) {
  PerfArgs a = parseArgs(argc, argv);
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    fprintf(stderr, "%s_perf (stand-in): ncclGetVersion failed\n", STANDIN_OP);
    return 1;
  }
  const char* rootEnv = getenv("RIGBOOK_EVIDENCE_ROOT");
  std::string root = rootEnv && *rootEnv ? rootEnv : "/";
  std::string commands = root + "/var/lib/rigbook/commands/";
  char host[64] = "localhost";
  gethostname(host, sizeof(host) - 1);
  std::string log = readText(commands + "nccl-log.txt");
  const char* disable = getenv("NCCL_P2P_DISABLE");
  bool p2p = log.find(" via P2P") != std::string::npos && !(disable && !strcmp(disable, "1"));
  printHeader(STANDIN_OP, a);
  printf("nccl-tests: Version rigbook-standin (TEST STAND-IN, built with NVCC_GENCODE %s)\n", STANDIN_GENCODE);
  const char* debug = getenv("NCCL_DEBUG");
  if (debug && !strcmp(debug, "INFO")) {
    printf("%s:%d:%d [0] NCCL INFO NCCL version %d.%d.%d\n", host, (int)getpid(), (int)getpid(), version / 10000,
           version / 100 % 100, version % 100);
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("NCCL version") != std::string::npos) continue;
      if (!p2p && line.find(" via P2P") != std::string::npos) continue;
      printf("%s\n", line.c_str());
    }
  }
  printDevices(a, host, (int)getpid(), root);
  double busbw = recordedBusbw(commands, STANDIN_OP, p2p, "cuda-probe.json");
  if (busbw <= 0) {
    fprintf(stderr, "%s_perf (stand-in): no recorded %s figure under %s\n", STANDIN_OP,
            p2p ? "collectives" : "host-staged", commands.c_str());
    return 1;
  }
  printTable(STANDIN_OP, a, busbw);
  return 0;
}
