// TEST STAND-IN for an rccl-tests program (rigbook lab tests): NOT rccl-tests, moves no data.
// Takes rccl-tests' flags (-b -e -f -g -n -w), initialises the communicators through the installed librccl
// (which logs its NCCL INFO lines and decides P2P or SHM from the topology and NCCL_P2P_LEVEL), and prints
// rccl-tests' table with figures read from the evidence tree under RIGBOOK_EVIDENCE_ROOT: the recorded
// collectives figures when librccl chose P2P, the recorded host-staged copy rate when it chose SHM.
#include <unistd.h>

#include "perf_table.h"
#include "rccl.h"

int main(int argc, char** argv) {
  PerfArgs a = parseArgs(argc, argv);
  const char* rootEnv = getenv("RIGBOOK_EVIDENCE_ROOT");
  std::string root = rootEnv && *rootEnv ? rootEnv : "/";
  std::string commands = root + "/var/lib/rigbook/commands/";
  char host[64] = "localhost";
  gethostname(host, sizeof(host) - 1);
  printHeader(STANDIN_OP, a);
  printf("rccl-tests: Version rigbook-standin (TEST STAND-IN, librccl targets %s)\n", rcclStandinGpuTargets());
  fflush(stdout);
  ncclComm_t comms[8];
  if (a.gpus < 1 || a.gpus > 8 || ncclCommInitAll(comms, a.gpus, NULL) != 0) {
    fprintf(stderr, "%s_perf (stand-in): ncclCommInitAll failed\n", STANDIN_OP);
    return 1;
  }
  printDevices(a, host, (int)getpid(), root);
  int p2p = rcclStandinP2p(comms[0]);
  double busbw = recordedBusbw(commands, STANDIN_OP, p2p, "hip-probe.json");
  if (busbw <= 0) {
    fprintf(stderr, "%s_perf (stand-in): no recorded %s figure under %s\n", STANDIN_OP,
            p2p ? "collectives" : "host-staged", commands.c_str());
    return 1;
  }
  printTable(STANDIN_OP, a, busbw);
  for (int r = 0; r < a.gpus; r++) ncclCommDestroy(comms[r]);
  return 0;
}
