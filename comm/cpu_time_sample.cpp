#include "comm/cpu_time_sample.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace tessera {

CpuTimeSample sample_cpu_time() {
  CpuTimeSample s;
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0)
    s.own_seconds = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + 1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  // The first line sums every core: user nice system idle iowait irq softirq steal (guest time
  // is already inside user). Idle and iowait are the cores' free time.
  std::ifstream stat("/proc/stat");
  std::string label;
  int64_t ticks[8] = {};
  if (!(stat >> label) || label != "cpu") return s;
  for (int64_t& t : ticks)
    if (!(stat >> t)) return s;
  for (int64_t t : ticks) s.total_ticks += t;
  s.busy_ticks = s.total_ticks - ticks[3] - ticks[4];
  s.valid = true;
  return s;
}

double others_share(const CpuTimeSample& from, const CpuTimeSample& to) {
  if (!from.valid || !to.valid || to.total_ticks <= from.total_ticks) return 0;
  const double tick = 1.0 / double(sysconf(_SC_CLK_TCK));
  const double all = double(to.total_ticks - from.total_ticks) * tick;
  const double busy = double(to.busy_ticks - from.busy_ticks) * tick;
  return std::clamp((busy - (to.own_seconds - from.own_seconds)) / all, 0.0, 1.0);
}

}  // namespace tessera
