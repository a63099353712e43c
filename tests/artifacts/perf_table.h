// TEST STAND-IN part shared by the lab's nccl-tests and rccl-tests stand-ins (packed into each tarball as
// src/perf_table.h by pack.py and rccl_standin.py): their flags, the evidence they read, and nccl-tests' table.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

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

// The flags both test suites take (-b -e -f -g -n -w).
struct PerfArgs {
  long long minBytes = 8, maxBytes = 128LL << 20, factor = 2;
  int gpus = 1, iters = 20, warmup = 5;
};

static PerfArgs parseArgs(int argc, char** argv) {
  PerfArgs a;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) a.minBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) a.maxBytes = parseSize(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) a.factor = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "-g")) a.gpus = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) a.iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) a.warmup = atoi(argv[i + 1]);
  }
  if (a.factor < 2) a.factor = 2;
  return a;
}

// The recorded figure the transport moves at: OP's busbw in collectives.json on P2P, else the host-staged copy
// rate in PROBE (hip-probe.json / cuda-probe.json); -1 when not recorded.
static double recordedBusbw(const std::string& commands, const char* op, bool p2p, const char* probe) {
  if (!p2p) return numberAfter(readText(commands + probe), "host_staged_gbs", 0);
  std::string text = readText(commands + "collectives.json");
  size_t at = text.find(std::string("\"op\": \"") + op + "\"");
  if (at == std::string::npos) return -1;
  size_t start = text.rfind('{', at);
  return numberAfter(text.substr(start, text.find('}', at) - start), "busbw_gbs", 0);
}

// nccl-tests' table for OP at BUSBW. Bus bandwidth factors: all_reduce busbw = algbw * 2(n-1)/n; all_gather and
// reduce_scatter algbw * (n-1)/n (seed 004: AllGather algbw 18.31 -> busbw 9.16 on 2 GPUs); sendrecv busbw = algbw.
// all_gather and reduce_scatter print the per-rank element count (size / 4 / n); all_gather has no redop.
static void printTable(const char* op, const PerfArgs& a, double busbw) {
  bool gather = strcmp(op, "all_gather") == 0, scatter = strcmp(op, "reduce_scatter") == 0;
  double ratio = 1.0;
  if (strcmp(op, "all_reduce") == 0 && a.gpus > 1) ratio = 2.0 * (a.gpus - 1) / a.gpus;
  if ((gather || scatter) && a.gpus > 1) ratio = (double)(a.gpus - 1) / a.gpus;
  long long perRank = gather || scatter ? a.gpus : 1;
  const char* redop = gather ? "none" : "sum";
  double algbw = busbw / ratio;
  printf("#\n#%*s out-of-place %*s in-place\n", 60, "", 22, "");
  printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
         "busbw #wrong\n");
  printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
         "(GB/s)\n");
  for (long long size = a.minBytes; size <= a.maxBytes; size *= a.factor) {
    double timeUs = (double)size / (algbw * 1e3);
    printf("%12lld  %12lld     float  %6s      -1  %7.1f  %6.2f  %6.2f      0  %7.1f  %6.2f  %6.2f      0\n",
           size, size / 4 / perRank, redop, timeUs, algbw, busbw, timeUs, algbw, busbw);
    if (size > a.maxBytes / a.factor) break;
  }
  printf("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %.4f\n#\n", busbw);
}

static void printHeader(const char* op, const PerfArgs& a) {
  printf("# Collective test starting: %s_perf\n", op);
  printf("# nThread 1 nGpus %d minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %d iters: %d "
         "agg iters: 1 validation: 1 graph: 0\n#\n", a.gpus, a.minBytes, a.maxBytes, a.factor, a.warmup, a.iters);
}

static void printDevices(const PerfArgs& a, const char* host, int pid, const std::string& root) {
  printf("# Using devices\n");
  for (int r = 0; r < a.gpus; r++) {
    printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [stand-in] evidence %s\n", r, pid, host, r, root.c_str());
  }
}
