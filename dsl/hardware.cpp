#include "dsl/hardware.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsl/error.hpp"
#include "dsl/published_gpu_efficiency.hpp"

namespace tessera {
namespace {

constexpr double kTera = 1e12, kGiga = 1e9;
constexpr int64_t kMiB = int64_t(1) << 20;

// A datasheet's figures, dense: TFLOPS of the matrix units (f64, tf32 for f32 GEMMs, bf16 = f16)
// and of the vector units (f64, f32: bf16 and f16 kernels compute in f32), memory, links.
struct Datasheet {
  const char* name;
  double gemm_f64, gemm_tf32, gemm_bf16;  // TFLOPS
  double vector_f64, vector_f32;          // TFLOPS
  int64_t memory_mib;
  double memory_gb_per_second, intra_node_gb_per_second, inter_node_gb_per_second;  // each way
  // The family's published measurements below the datasheet (dsl/published_gpu_efficiency.hpp):
  // Hopper's GEMM efficiency by intensity; NCCL's protocol overhead on NVLink.
  bool hopper_gemms = false, nvlink = false;
};

// A GPU from its datasheet. Latencies are not published: a kernel launch of about 4 us and
// NCCL's per-message latency of about 3 us on NVLink and 6 us over InfiniBand are the values
// nccl-tests shows for small messages; treat them as modelled, not measured. Where published
// measurements say how far below the datasheet the family runs (Hopper's GEMMs by shape, NCCL
// on NVLink), the profile carries them; the others run every GEMM at the peak and every link
// at its line rate (docs/PLANNING.md, "What the GPU time model leaves out").
Hardware published_gpu(const Datasheet& d) {
  Hardware h;
  h.name = d.name;
  h.device = DeviceKind::GPU;
  h.gemm_flops = {{DType::f64, d.gemm_f64 * kTera}, {DType::f32, d.gemm_tf32 * kTera}, {DType::bf16, d.gemm_bf16 * kTera},
                  {DType::f16, d.gemm_bf16 * kTera}};
  h.vector_flops = {{DType::f64, d.vector_f64 * kTera}, {DType::f32, d.vector_f32 * kTera}, {DType::bf16, d.vector_f32 * kTera},
                    {DType::f16, d.vector_f32 * kTera}};
  h.memory_bytes = d.memory_mib * kMiB;
  h.memory_bytes_per_second = d.memory_gb_per_second * kGiga;
  h.launch_seconds = 4e-6;
  h.intra_node = Link{3e-6, d.intra_node_gb_per_second * kGiga * (d.nvlink ? nvlink_nccl_efficiency() : 1.0)};
  h.inter_node = Link{6e-6, d.inter_node_gb_per_second * kGiga};
  // Attention runs on Tessera's CUDA kernels: f32 and f64 on the CUDA cores (their measured share
  // of the f32 vector rate), bf16 and f16 on the tensor cores (their measured share of its peak).
  for (DType dtype : {DType::f64, DType::f32})
    h.attention_flops[dtype] = d.vector_f32 * kTera * cuda_attention_vector_efficiency();
  for (DType dtype : {DType::bf16, DType::f16})
    h.attention_flops[dtype] = d.gemm_bf16 * kTera * cuda_tensor_core_attention_efficiency();
  if (d.hopper_gemms) {
    h.gemm_efficiency = hopper_tf32_gemm_efficiency();  // f32 GEMMs run on the TF32 units
    h.gemm_efficiency_by_dtype = {{DType::bf16, hopper_bf16_gemm_efficiency()}, {DType::f16, hopper_bf16_gemm_efficiency()}};
  }
  return h;
}

// NVIDIA H100 SXM5 80GB. Rates: "NVIDIA H100 Tensor Core GPU" datasheet (2023), dense figures
// (the datasheet's sparse ones are twice these): FP64 34 TFLOPS, FP64 Tensor Core 67, FP32 67,
// TF32 Tensor Core 494.7, BF16 / FP16 Tensor Core 989.4; HBM3 3.35 TB/s; NVLink 900 GB/s per GPU
// (both directions together: 450 GB/s each way). Memory: 81,559 MiB, what nvidia-smi reports for
// the 80 GB part. Between nodes: DGX H100 gives each GPU one ConnectX-7 NDR port, 400 Gb/s
// (50 GB/s each way) ("NVIDIA DGX H100 System User Guide", hardware overview).
Hardware h100_sxm() { return published_gpu({"h100-sxm", 67, 494.7, 989.4, 34, 67, 81559, 3350, 450, 50, true, true}); }

// NVIDIA H200 SXM 141GB: the H100 SXM's compute ("NVIDIA H200 Tensor Core GPU" datasheet, 2024:
// the same dense Tensor Core figures) with HBM3e, 4.8 TB/s; 143,771 MiB as nvidia-smi reports
// it; NVLink 900 GB/s; the same per-GPU NDR InfiniBand in HGX H200 systems.
Hardware h200() { return published_gpu({"h200", 67, 494.7, 989.4, 34, 67, 143771, 4800, 450, 50, true, true}); }

// NVIDIA A100 SXM4 80GB. Rates: "NVIDIA A100 Tensor Core GPU" datasheet (2021), dense figures:
// FP64 9.7 TFLOPS, FP64 Tensor Core 19.5, FP32 19.5, TF32 Tensor Core 156, BF16 / FP16 Tensor
// Core 312; HBM2e 2,039 GB/s; 81,920 MiB as nvidia-smi reports the 80 GB part. NVLink 600 GB/s
// per GPU (300 GB/s each way). Between nodes: DGX A100 gives each GPU one ConnectX-6 HDR port,
// 200 Gb/s (25 GB/s each way) ("NVIDIA DGX A100 System Architecture" whitepaper).
Hardware a100_sxm4_80gb() { return published_gpu({"a100-sxm4-80gb", 19.5, 156, 312, 9.7, 19.5, 81920, 2039, 300, 25, false, true}); }

// NVIDIA A100 SXM4 40GB: the 80 GB part's compute and links (the same datasheet) with HBM2,
// 1,555 GB/s, and 40,960 MiB as nvidia-smi reports it.
Hardware a100_sxm4_40gb() { return published_gpu({"a100-sxm4-40gb", 19.5, 156, 312, 9.7, 19.5, 40960, 1555, 300, 25, false, true}); }

// AMD Instinct MI300X (OAM). Rates: the "AMD Instinct MI300X Accelerator" data sheet (2023),
// dense figures: FP64 vector 81.7 TFLOPS, FP64 matrix 163.4, FP32 vector 163.4, TF32 matrix
// 653.7, BF16 / FP16 matrix 1,307.4; HBM3 5.3 TB/s; 192 GB as 8 stacks of 24 GiB (196,608 MiB).
// Infinity Fabric: 7 links of 128 GB/s (both directions together) to the other 7 GPUs of a
// platform, 448 GB/s each way in all. Between nodes: one 400 Gb/s NIC per GPU (50 GB/s each way),
// as MI300X platforms are built.
Hardware mi300x() { return published_gpu({"mi300x", 163.4, 653.7, 1307.4, 81.7, 163.4, 196608, 5300, 448, 50}); }

// NVIDIA B200 in an HGX B200 board (1,000 W). Rates: the "NVIDIA HGX B200" datasheet (2024),
// dense figures (half the sparse ones it lists): FP64 / FP64 Tensor Core 40 TFLOPS, FP32 80,
// TF32 Tensor Core 1,100, BF16 / FP16 Tensor Core 2,250; HBM3e 8 TB/s; 183,359 MiB as nvidia-smi
// reports it ("180 GB"). NVLink 5: 1.8 TB/s per GPU (900 GB/s each way). Between nodes: DGX B200
// gives each GPU one ConnectX-7 400 Gb/s port (50 GB/s each way).
Hardware b200() { return published_gpu({"b200", 40, 1100, 2250, 40, 80, 183359, 8000, 900, 50, false, true}); }

template <class Key>
double rate(const std::map<Key, double>& rates, Key key) {
  auto it = rates.find(key);
  return it == rates.end() ? 0 : it->second;
}

nlohmann::json rates_json(const std::map<DType, double>& rates) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [dtype, r] : rates) out[std::string(dtype_name(dtype))] = r;
  return out;
}

std::map<DType, double> rates_from(const nlohmann::json& j) {
  std::map<DType, double> out;
  for (const auto& [name, r] : j.items()) out[dtype_from_name(name)] = r.get<double>();
  return out;
}

nlohmann::json link_json(const Link& l) { return {{"latency_seconds", l.latency_seconds}, {"bytes_per_second", l.bytes_per_second}}; }

// The range checks of check_hardware, each naming the field and its value.
struct FieldChecks {
  const std::string& who;

  [[noreturn]] void refuse(const std::string& field, const std::string& value, const char* rule) const {
    throw Error(who + ": field '" + field + "' is " + value + "; " + rule);
  }
  void positive(const std::string& field, double value) const {
    if (!(std::isfinite(value) && value > 0)) refuse(field, fmt::format("{}", value), "it must be finite and positive");
  }
  void non_negative(const std::string& field, double value) const {
    if (!(std::isfinite(value) && value >= 0)) refuse(field, fmt::format("{}", value), "it must be finite and at least 0");
  }
  void at_least(const std::string& field, int64_t value, int64_t least) const {
    if (value < least) refuse(field, std::to_string(value), least == 0 ? "it must be at least 0" : "it must be at least 1");
  }
  // A cache of `bytes` (0: none) needs a positive bandwidth.
  void cache(const std::string& field, int64_t bytes, double bytes_per_second) const {
    at_least(field, bytes, 0);
    if (bytes > 0) positive(field + "_per_second", bytes_per_second);
    else non_negative(field + "_per_second", bytes_per_second);
  }
  void rates(const std::string& field, const std::map<DType, double>& by_dtype) const {
    for (const auto& [dtype, r] : by_dtype)
      if (!(std::isfinite(r) && r > 0))
        refuse(field + "." + std::string(dtype_name(dtype)), fmt::format("{}", r),
               "a rate must be finite and positive (leave the dtype out for none)");
  }
  void curve(const std::string& field, const std::vector<std::pair<double, double>>& points) const {
    for (size_t i = 0; i < points.size(); ++i) {
      const auto& [intensity, fraction] = points[i];
      const std::string point = field + "[" + std::to_string(i) + "]";
      if (!(std::isfinite(intensity) && intensity > 0))
        refuse(point, fmt::format("[{}, {}]", intensity, fraction), "its intensity must be finite and positive");
      if (!(std::isfinite(fraction) && fraction > 0 && fraction <= 1))
        refuse(point, fmt::format("[{}, {}]", intensity, fraction), "its fraction of the peak must be in (0, 1]");
    }
  }
};

// An integer field of the JSON: a whole number within int64 (nlohmann's get<int64_t> would
// wrap 2^64 - 1 to -1 and turn 1e30 into INT64_MIN).
int64_t int64_from(const nlohmann::json& value, const std::string& field) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_unsigned() && value.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    // 2^63 is the first double past int64.
    if (std::isfinite(d) && d == std::trunc(d) && d >= -0x1p63 && d < 0x1p63) return int64_t(d);
  }
  if (value.is_number())
    throw Error("hardware_from_json: field '" + field + "' is " + value.dump() + ", not a whole number within int64 (at most 2^63 - 1)");
  return value.get<int64_t>();  // not a number: nlohmann's type_error, reported as the wrong type
}

}  // namespace

void check_hardware(const Hardware& h, const std::string& who) {
  const FieldChecks check{who};
  check.rates("gemm_flops", h.gemm_flops);
  check.rates("vector_flops", h.vector_flops);
  check.rates("attention_flops", h.attention_flops);
  if (!h.vector_flops.count(DType::f32))
    throw Error(who + ": field 'vector_flops' has no float32 rate; every kernel of a dtype without its own is charged at it");
  check.at_least("memory_bytes", h.memory_bytes, 1);
  check.positive("memory_bytes_per_second", h.memory_bytes_per_second);
  check.cache("cache_bytes", h.cache_bytes, h.cache_bytes_per_second);
  check.cache("shared_cache_bytes", h.shared_cache_bytes, h.shared_cache_bytes_per_second);
  check.non_negative("launch_seconds", h.launch_seconds);
  for (const auto& [name, link] : {std::pair{"intra_node", &h.intra_node}, std::pair{"inter_node", &h.inter_node}}) {
    check.non_negative(std::string(name) + ".latency_seconds", link->latency_seconds);
    check.positive(std::string(name) + ".bytes_per_second", link->bytes_per_second);
  }
  check.curve("gemm_efficiency", h.gemm_efficiency);
  for (const auto& [dtype, curve] : h.gemm_efficiency_by_dtype) check.curve("gemm_efficiency_by_dtype." + std::string(dtype_name(dtype)), curve);
  for (const auto& [dtype, rates] : h.special_functions_per_second)
    for (const auto& [f, r] : rates)
      check.positive("special_functions_per_second." + std::string(dtype_name(dtype)) + "." + std::string(special_function_name(f)), r);
  check.at_least("cores", h.cores, 1);
}

double Hardware::gemm_rate(DType dtype) const {
  const double r = rate(gemm_flops, dtype);
  return r > 0 ? r : vector_rate(dtype);
}

double Hardware::vector_rate(DType dtype) const { return rate(vector_flops, dtype); }
double Hardware::attention_rate(DType dtype) const { return rate(attention_flops, dtype); }
double Hardware::special_function_rate(DType dtype, SpecialFunction f) const {
  const auto rates = special_functions_per_second.find(dtype);
  return rates == special_functions_per_second.end() ? 0 : rate(rates->second, f);
}

double Hardware::gemm_rate(DType dtype, double intensity) const {
  const double peak = gemm_rate(dtype);
  const auto by_dtype = gemm_efficiency_by_dtype.find(dtype);
  const auto& curve = by_dtype != gemm_efficiency_by_dtype.end() ? by_dtype->second : gemm_efficiency;
  if (curve.empty() || intensity <= 0) return peak;
  if (intensity <= curve.front().first) return peak * curve.front().second * intensity / curve.front().first;
  const auto hi = std::upper_bound(curve.begin(), curve.end(), intensity, [](double i, const auto& point) { return i < point.first; });
  if (hi == curve.end()) return peak * curve.back().second;
  const auto lo = hi - 1;
  const double t = std::log(intensity / lo->first) / std::log(hi->first / lo->first);
  return peak * (lo->second + t * (hi->second - lo->second));
}


const std::vector<std::string>& published_hardware_names() {
  static const std::vector<std::string> names = {"h100-sxm", "h200", "a100-sxm4-80gb", "a100-sxm4-40gb", "mi300x", "b200"};
  return names;
}

Hardware published_hardware(const std::string& name) {
  if (name == "h100-sxm") return h100_sxm();
  if (name == "h200") return h200();
  if (name == "a100-sxm4-80gb") return a100_sxm4_80gb();
  if (name == "a100-sxm4-40gb") return a100_sxm4_40gb();
  if (name == "mi300x") return mi300x();
  if (name == "b200") return b200();
  std::string known;
  for (const std::string& n : published_hardware_names()) known += "\"" + n + "\", ";
  throw Error("hardware_profile: no profile named '" + name + "' (known: " + known + "\"this-machine\")");
}

std::string hardware_to_json(const Hardware& h) {
  nlohmann::json j = {{"name", h.name},
                      {"device", std::string(device_kind_name(h.device))},
                      {"gemm_flops", rates_json(h.gemm_flops)},
                      {"vector_flops", rates_json(h.vector_flops)},
                      {"memory_bytes", h.memory_bytes},
                      {"memory_bytes_per_second", h.memory_bytes_per_second},
                      {"launch_seconds", h.launch_seconds},
                      {"intra_node", link_json(h.intra_node)},
                      {"inter_node", link_json(h.inter_node)}};
  if (!h.attention_flops.empty()) j["attention_flops"] = rates_json(h.attention_flops);
  if (!h.gemm_efficiency.empty()) j["gemm_efficiency"] = h.gemm_efficiency;
  if (!h.gemm_efficiency_by_dtype.empty()) {
    nlohmann::json curves = nlohmann::json::object();
    for (const auto& [dtype, curve] : h.gemm_efficiency_by_dtype) curves[dtype_name(dtype)] = curve;
    j["gemm_efficiency_by_dtype"] = curves;
  }
  if (h.cores != 1) j["cores"] = h.cores;
  if (h.cache_bytes > 0) j["cache_bytes"] = h.cache_bytes, j["cache_bytes_per_second"] = h.cache_bytes_per_second;
  if (h.shared_cache_bytes > 0)
    j["shared_cache_bytes"] = h.shared_cache_bytes, j["shared_cache_bytes_per_second"] = h.shared_cache_bytes_per_second;
  if (!h.special_functions_per_second.empty()) {
    nlohmann::json by_dtype = nlohmann::json::object();
    for (const auto& [dtype, rates] : h.special_functions_per_second) {
      nlohmann::json by_function = nlohmann::json::object();
      for (const auto& [f, r] : rates) by_function[std::string(special_function_name(f))] = r;
      by_dtype[dtype_name(dtype)] = by_function;
    }
    j["special_functions_per_second"] = by_dtype;
  }
  return j.dump(2);
}

Hardware hardware_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("hardware_from_json: not JSON: ") + e.what());
  }
  std::string field;
  try {
    Hardware h;
    auto at = [&](const char* name) -> const nlohmann::json& {
      field = name;
      return j.at(name);
    };
    h.name = at("name").get<std::string>();
    const auto kind = device_kind_from_name(at("device").get<std::string>());
    if (!kind) throw Error("hardware_from_json: field 'device' names no device kind (\"CPU\" or \"GPU\")");
    h.device = *kind;
    h.gemm_flops = rates_from(at("gemm_flops"));
    h.vector_flops = rates_from(at("vector_flops"));
    h.memory_bytes = int64_from(at("memory_bytes"), field);
    h.memory_bytes_per_second = at("memory_bytes_per_second").get<double>();
    h.launch_seconds = at("launch_seconds").get<double>();
    for (auto [name, link] : {std::pair{"intra_node", &h.intra_node}, std::pair{"inter_node", &h.inter_node}}) {
      const nlohmann::json& l = at(name);
      field = std::string(name) + ".latency_seconds";
      link->latency_seconds = l.at("latency_seconds").get<double>();
      field = std::string(name) + ".bytes_per_second";
      link->bytes_per_second = l.at("bytes_per_second").get<double>();
    }
    // Optional fields: one core, no cache, special functions at the vector rate, GEMMs at the peak.
    if (j.contains("cores")) h.cores = int64_from(at("cores"), field);
    if (j.contains("attention_flops")) h.attention_flops = rates_from(at("attention_flops"));
    if (j.contains("cache_bytes")) {
      h.cache_bytes = int64_from(at("cache_bytes"), field);
      h.cache_bytes_per_second = at("cache_bytes_per_second").get<double>();
    }
    if (j.contains("shared_cache_bytes")) {
      h.shared_cache_bytes = int64_from(at("shared_cache_bytes"), field);
      h.shared_cache_bytes_per_second = at("shared_cache_bytes_per_second").get<double>();
    }
    if (j.contains("special_functions_per_second"))
      for (const auto& [name, rates] : at("special_functions_per_second").items()) {
        field = "special_functions_per_second." + name;
        auto& into = h.special_functions_per_second[dtype_from_name(name)];
        if (rates.is_number()) {
          for (SpecialFunction f : kSpecialFunctions) into[f] = rates.get<double>();
          continue;
        }
        for (const auto& [function, r] : rates.items()) {
          const auto f = special_function_from_name(function);
          if (!f)
            throw Error("hardware_from_json: field 'special_functions_per_second." + name + "' names '" + function +
                        "', no special function (exp, log, tanh, pow)");
          field = "special_functions_per_second." + name + "." + function;
          into[*f] = r.get<double>();
        }
      }
    auto sorted_curve = [&](const nlohmann::json& points, const std::string& name) {
      auto curve = points.get<std::vector<std::pair<double, double>>>();
      if (!std::is_sorted(curve.begin(), curve.end()))
        throw Error("hardware_from_json: field '" + name + "' is not sorted by intensity");
      return curve;
    };
    if (j.contains("gemm_efficiency")) h.gemm_efficiency = sorted_curve(at("gemm_efficiency"), "gemm_efficiency");
    if (j.contains("gemm_efficiency_by_dtype"))
      for (const auto& [name, points] : at("gemm_efficiency_by_dtype").items()) {
        field = "gemm_efficiency_by_dtype." + name;
        h.gemm_efficiency_by_dtype[dtype_from_name(name)] = sorted_curve(points, field);
      }
    check_hardware(h, "hardware_from_json");
    return h;
  } catch (const nlohmann::json::exception& e) {
    throw Error("hardware_from_json: field '" + field + "' is missing or of the wrong type (" + e.what() + ")");
  }
}

}  // namespace tessera
