// Timing helpers shared by the benchmarks: medians of repeated runs, printed as tables.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace tessera::bench {

// Median seconds per call of fn over `repetitions` timed runs of `iterations` calls each,
// after one warm-up call.
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

}  // namespace tessera::bench
