// Timing helpers shared by the benchmarks: medians of repeated runs, printed as tables.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessera::bench {

// Median seconds per call of fn over `repetitions` timed runs of `iterations` calls each,
// after one warm-up call.
// Calls fn for at least `seconds`: on these VMs an idle second core takes some 100 ms of work
// to reach full speed (a 1024^3 GEMM on 2 cores ran at 0.55x for its first four calls).
inline void warm_up(const std::function<void()>& fn, double seconds = 0.3) {
  const auto start = std::chrono::steady_clock::now();
  do fn();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
}

inline double median_seconds(const std::function<void()>& fn, int repetitions = 7, int iterations = 1) {
  fn();
  std::vector<double> samples;
  for (int r = 0; r < repetitions; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// What a probe process printed: milliseconds, LLVM compilations, disk cache hits.
struct ProbeResult {
  double ms = 0;
  long long compiled = 0, disk_hits = 0;
};

// Runs `self --probe-flag DIR` twice with one fresh compile-cache directory: a cold start, then a
// warm start from the disk cache in a new process. nullopt when a probe fails.
inline std::optional<std::pair<ProbeResult, ProbeResult>> cold_and_warm(const std::string& self, const std::string& probe_flag) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("tessera-bench-cache-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  ProbeResult runs[2];
  for (ProbeResult& r : runs) {
    FILE* pipe = popen((self + " " + probe_flag + " " + dir).c_str(), "r");
    const bool ok = pipe && fscanf(pipe, "%lf %lld %lld", &r.ms, &r.compiled, &r.disk_hits) == 3;
    if (pipe) pclose(pipe);
    if (!ok) return std::nullopt;
  }
  std::filesystem::remove_all(dir);
  return std::make_pair(runs[0], runs[1]);
}

}  // namespace tessera::bench
