// What a device and its links can do, as plain data the planner predicts step times from
// (issue: plan a job before running it). Published profiles of datacenter GPUs and a measured
// one of this machine (plan/hardware_profiles.hpp) are all a Hardware; a user writes one for other
// hardware by hand or from JSON (hardware_from_json).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dsl/device_kind.hpp"
#include "dsl/dtype.hpp"
#include "dsl/special_function.hpp"

namespace tessera {

// One device's link to its peers at one level, one direction: a transfer of n bytes costs
// latency + n / bytes_per_second (the alpha-beta model).
struct Link {
  double latency_seconds = 0;
  double bytes_per_second = 0;
  bool operator==(const Link&) const = default;
};

struct Hardware {
  std::string name;
  DeviceKind device = DeviceKind::GPU;
  // Dense peak FLOP/s of one device for GEMMs (its matrix units), by operand dtype; dtypes
  // without an entry take vector_flops.
  std::map<DType, double> gemm_flops;
  // Dense peak FLOP/s of one device for everything else (fused elementwise and reduction
  // kernels), by dtype; bf16/f16 values are computed in f32 (codegen/storage_rounding.hpp).
  std::map<DType, double> vector_flops;
  int64_t memory_bytes = 0;             // one device's memory
  double memory_bytes_per_second = 0;   // and its bandwidth
  // The cache a device's kernels write into and read back from (a CPU's L2s: its share, where
  // devices take turns on a core) and the bandwidth of data found there. A plan follows which
  // values are in it, least recently touched out first, and charges a kernel's bytes there at
  // this rate (plan/cache_residency.hpp; 0: every byte from memory, as the published GPU profiles
  // are planned).
  int64_t cache_bytes = 0;
  double cache_bytes_per_second = 0;
  // The last-level cache behind it, which every core of the machine shares (a CPU's L3; a device
  // planned with its share where several run at once), and the bandwidth of data found there.
  // Values the inner cache lost are found here while they fit (0: none).
  int64_t shared_cache_bytes = 0;
  double shared_cache_bytes_per_second = 0;
  double launch_seconds = 0;            // fixed cost of one kernel or library call
  // Links as collectives use them: a published NVLink's bytes_per_second is what NCCL moves
  // over it (its bus bandwidth), not the line rate.
  Link intra_node;                      // to devices of the same node (NVLink, shared memory)
  Link inter_node;                      // to devices of other nodes (InfiniBand)
  // How far below its peak a small GEMM runs: {arithmetic intensity, fraction of gemm_flops}
  // points sorted by intensity, where a GEMM's intensity is m n k / (m n + n k + m k) of one
  // matrix (a batched GEMM's too). Between points the fraction is interpolated on a log scale of
  // the intensity; below the first it falls in proportion to the intensity, above the last it
  // stays the last. Empty: every GEMM at the peak (the published profiles without a published
  // curve: dsl/published_gpu_efficiency.hpp has Hopper's).
  std::vector<std::pair<double, double>> gemm_efficiency;
  // The same, for dtypes whose small GEMMs fall off differently (a CPU's bf16 GEMMs convert and
  // pack their operands); dtypes without an entry follow gemm_efficiency.
  std::map<DType, std::vector<std::pair<double, double>>> gemm_efficiency_by_dtype;
  // FLOP/s the backend's fused attention kernel reaches (forward and gradients alike), by
  // dtype. None: attention is costed as GEMMs of its shape (gemm_rate at its intensity), as
  // this machine's CPU kernel runs it.
  std::map<DType, double> attention_flops;
  // Evaluations per second of each special function (exp, log, tanh, pow) in a vector kernel,
  // by dtype (none: it costs one FLOP at vector_flops). Where they are computed in software
  // (this machine's kernels) they, not the arithmetic, set a kernel's time, and each at its own
  // rate: a CPU's tanh runs at about half its exp's. In JSON a dtype's entry is an object by
  // function name, or one number for all four.
  std::map<DType, std::map<SpecialFunction, double>> special_functions_per_second;
  // A CPU device's cores: the rates above are all of them together, and a kernel the executor
  // runs on one core (jit/device.hpp: kernel_splits_over_cores) gets 1/cores of the vector rate
  // and of the inner cache's bandwidth (the shared cache and the memory stream to one core
  // about as fast as to all). 1 for GPUs.
  int64_t cores = 1;

  // The peak rate for a GEMM or a vector kernel of `dtype` (0 when the profile has none).
  double gemm_rate(DType dtype) const;
  double vector_rate(DType dtype) const;
  double special_function_rate(DType dtype, SpecialFunction f) const;  // 0: none given
  double attention_rate(DType dtype) const;                             // 0: none given
  // The rate a GEMM of `dtype` and this arithmetic intensity runs at (gemm_efficiency).
  double gemm_rate(DType dtype, double intensity) const;

  bool operator==(const Hardware&) const = default;
};

// The published profiles: "h100-sxm", "h200", "a100-sxm4-80gb", "a100-sxm4-40gb", "mi300x",
// "b200" (each from its datasheet, cited in dsl/hardware.cpp); Error naming the known ones for
// any other name. ("this-machine" is measured: plan/hardware_profiles.hpp.)
Hardware published_hardware(const std::string& name);
const std::vector<std::string>& published_hardware_names();

// Error naming `who`, the field and its value for a figure no device has: anything not finite;
// a rate, bandwidth, memory size or core count that is not positive; a latency or launch cost
// below 0; a cache size below 0, or a cache without its bandwidth; vector_flops without float32
// (the rate every kernel of a dtype without its own falls back on); an efficiency point whose
// intensity is not positive or whose fraction is outside (0, 1]. A plan on such a profile would
// predict negative, infinite or NaN times, or fit anything in a negative memory.
void check_hardware(const Hardware& hardware, const std::string& who);

std::string hardware_to_json(const Hardware& hardware);
// Error naming the field for missing or ill-typed fields, an integer field that is not a whole
// number within int64, and every figure check_hardware refuses.
Hardware hardware_from_json(const std::string& json);

}  // namespace tessera
