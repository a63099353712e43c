// TEST STAND-IN for an nccl-tests program (rigbook lab tests): NOT nccl-tests, moves no data (the lab has no GPU).
// Takes nccl-tests' flags (-b -e -f -g -n -w), asks the NCCL it was linked against for its version (ncclGetVersion:
// the real pip wheel's libnccl in the lab), and prints nccl-tests' table with figures read from the evidence tree
// under RIGBOOK_EVIDENCE_ROOT: when the recorded NCCL log goes through P2P (and NCCL_P2P_DISABLE is not 1), the
// recorded collectives figures; otherwise the recorded host-staged copy rate (cuda-probe.json), which is what SHM
// moves at. With NCCL_DEBUG=INFO it prints NCCL's version line from the real library, then the recorded log lines.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "nccl.h"

static std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// The number after "KEY": at or after FROM in a JSON text (-1 when absent or null).
static double numberAfter(const std::string& text, const std::string& key, size_t from) {
  size_t at = text.find("\"" + key + "\"", from);
  if (at == std::string::npos) return -1;
  at = text.find(':', at);
  if (at == std::string::npos) return -1;
  const char* start = text.c_str() + at + 1;
  char* end = NULL;
  double value = strtod(start, &end);
  return end == start ? -1 : value;
}

static long long parseSize(const char* text) {
  char* end = NULL;
  double value = strtod(text, &end);
  switch (end && *end ? *end : 0) {
    case 'K': case 'k': value *= 1024; break;
    case 'M': case 'm': value *= 1024 * 1024; break;
    case 'G': case 'g': value *= 1024.0 * 1024 * 1024; break;
  }
  return (long long)value;
}

int main(int argc, char** argv) {
  long long minBytes = 8, maxBytes = 128LL << 20, factor = 2;
  int gpus = 1, iters = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "-g")) gpus = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
  }
  if (factor < 2) factor = 2;
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
  printf("# Collective test starting: %s_perf\n", STANDIN_OP);
  printf("# nThread 1 nGpus %d minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %d iters: %d "
         "agg iters: 1 validation: 1 graph: 0\n#\n", gpus, minBytes, maxBytes, factor, warmup, iters);
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
  printf("# Using devices\n");
  for (int r = 0; r < gpus; r++) {
    printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [stand-in] evidence %s\n", r, (int)getpid(), host, r,
           root.c_str());
  }
  double busbw = -1;
  if (p2p) {
    std::string text = readText(commands + "collectives.json");
    size_t at = text.find("\"op\": \"" STANDIN_OP "\"");
    if (at != std::string::npos) {
      size_t start = text.rfind('{', at);
      busbw = numberAfter(text.substr(start, text.find('}', at) - start), "busbw_gbs", 0);
    }
  } else {
    busbw = numberAfter(readText(commands + "cuda-probe.json"), "host_staged_gbs", 0);
  }
  if (busbw <= 0) {
    fprintf(stderr, "%s_perf (stand-in): no recorded %s figure under %s\n", STANDIN_OP,
            p2p ? "collectives" : "host-staged", commands.c_str());
    return 1;
  }
  // nccl-tests' bus bandwidth factors: all_reduce busbw = algbw * 2(n-1)/n; all_gather and reduce_scatter
  // algbw * (n-1)/n; sendrecv busbw = algbw.
  bool gather = strcmp(STANDIN_OP, "all_gather") == 0, scatter = strcmp(STANDIN_OP, "reduce_scatter") == 0;
  double ratio = 1.0;
  if (strcmp(STANDIN_OP, "all_reduce") == 0 && gpus > 1) ratio = 2.0 * (gpus - 1) / gpus;
  if ((gather || scatter) && gpus > 1) ratio = (double)(gpus - 1) / gpus;
  long long perRank = gather || scatter ? gpus : 1;
  const char* redop = gather ? "none" : "sum";
  double algbw = busbw / ratio;
  printf("#\n#%*s out-of-place %*s in-place\n", 60, "", 22, "");
  printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
         "busbw #wrong\n");
  printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
         "(GB/s)\n");
  for (long long size = minBytes; size <= maxBytes; size *= factor) {
    double timeUs = (double)size / (algbw * 1e3);
    printf("%12lld  %12lld     float  %6s      -1  %7.1f  %6.2f  %6.2f      0  %7.1f  %6.2f  %6.2f      0\n",
           size, size / 4 / perRank, redop, timeUs, algbw, busbw, timeUs, algbw, busbw);
    if (size > maxBytes / factor) break;
  }
  printf("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %.4f\n#\n", busbw);
  return 0;
}
