// The CUDA grouped GEMMs without a GPU: backend/cuda/grouped_gemm.cu and grouped_gemm_mma.cu
// (tensor cores) compiled as C++ and run thread for thread on the CPU (test/cuda_emulation.hpp), against the primitives' definition in
// f64 and against the CPU's kernels (backend/cpu/cpu_grouped_gemm.cpp), with groups that are
// empty, cross tile edges, lie outside the device's block of rows or come with decreasing ends;
// the host logic that sizes a launch; and the source NVRTC compiles for sm_80 and sm_90.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <vector>

#include "cuda_emulation.hpp"
// The kernels themselves, as C++ (uint16_t and the prelude's conversions come from above).
#include "backend/cuda/storage_types.cu"
#include "backend/cuda/grouped_gemm.cu"
#include "backend/cuda/warp_fragments.cu"
#include "backend/cuda/grouped_gemm_mma.cu"
#include "cuda_storage_values.hpp"

#include "backend/cpu/cpu_grouped_gemm.hpp"
#include "backend/cuda/cuda_grouped_gemm.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/nvrtc_library.hpp"
#include "nvrtc_available.hpp"
#include "dsl/error.hpp"

using namespace tessera;
using tessera::cuda_emulation::dtype_of_element;
using tessera::cuda_emulation::from_double;
using tessera::cuda_emulation::to_double;

namespace {

// Narrow outputs are rounded once (bf16 keeps 8 bits, f16 11); f32 sums in the reference's order
// but rounds each step.
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, tsr_grouped::Bf16>) return 1e-2;
  else if constexpr (std::is_same_v<T, tsr_grouped::F16>) return 2e-3;
  else if constexpr (std::is_same_v<T, double>) return 1e-12;
  else return 1e-5;
}

struct Case {
  int64_t n, k, f;
  std::vector<int64_t> ends;  // global running totals, possibly decreasing
  int64_t row_offset;
};

std::string describe(const Case& c) {
  std::string ends;
  for (int64_t e : c.ends) ends += fmt::format("{}{}", ends.empty() ? "" : ",", e);
  return fmt::format("n {} k {} f {} ends [{}] row_offset {}", c.n, c.k, c.f, ends, c.row_offset);
}

// Each group's local rows [begin, end): the running maximum of ends, clamped to the block (the
// primitives' definition, dsl/grouped_matmul.hpp).
std::vector<std::pair<int64_t, int64_t>> local_groups(const Case& c) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t before = 0;
  auto local = [&](int64_t global) { return std::clamp<int64_t>(global - c.row_offset, 0, c.n); };
  for (int64_t e : c.ends) {
    const int64_t through = std::max(before, e);
    out.push_back({local(before), local(through)});
    before = through;
  }
  return out;
}

template <class T>
struct Operands {
  std::vector<T> x, w, dy;  // x [n, k], w [E, k, f], dy [n, f]
};

template <class T>
Operands<T> random_operands(const Case& c, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](int64_t count) {
    std::vector<T> v(static_cast<size_t>(count));
    for (T& e : v) e = from_double<T>(normal(rng));
    return v;
  };
  const int64_t experts = int64_t(c.ends.size());
  return {fill(c.n * c.k), fill(experts * c.k * c.f), fill(c.n * c.f)};
}

// out [n, f] = x times w[g] for each row's group g; zero for rows in none.
template <class T>
std::vector<double> reference_gemm(const Case& c, const Operands<T>& o) {
  std::vector<double> out(size_t(c.n * c.f), 0.0);
  const auto groups = local_groups(c);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t r = groups[g].first; r < groups[g].second; ++r)
      for (int64_t j = 0; j < c.f; ++j) {
        double sum = 0;
        for (int64_t i = 0; i < c.k; ++i) sum += to_double(o.x[size_t(r * c.k + i)]) * to_double(o.w[size_t((int64_t(g) * c.k + i) * c.f + j)]);
        out[size_t(r * c.f + j)] = sum;
      }
  return out;
}

// out [E, k, f]: out[g] = x_g^T dy_g over the group's local rows.
template <class T>
std::vector<double> reference_weight_grad(const Case& c, const Operands<T>& o) {
  const auto groups = local_groups(c);
  std::vector<double> out(groups.size() * size_t(c.k * c.f), 0.0);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t r = groups[g].first; r < groups[g].second; ++r)
      for (int64_t i = 0; i < c.k; ++i)
        for (int64_t j = 0; j < c.f; ++j)
          out[(g * size_t(c.k) + size_t(i)) * size_t(c.f) + size_t(j)] +=
              to_double(o.x[size_t(r * c.k + i)]) * to_double(o.dy[size_t(r * c.f + j)]);
  return out;
}

// The emulated kernel's output for `op`, as a GPU of `compute_capability` runs it (80 and later:
// the experts' GEMM of 16-bit data on tensor cores).
template <class T>
std::vector<double> emulated(LibraryOp op, const Case& c, const Operands<T>& o, int compute_capability = 0) {
  const bool gemm = op == LibraryOp::GroupedGemm;
  std::vector<T> out(size_t(gemm ? c.n * c.f : int64_t(c.ends.size()) * c.k * c.f), from_double<T>(std::nan("")));
  std::vector<long long> ends(c.ends.begin(), c.ends.end());
  const GroupedGemmKernel kernel = grouped_gemm_kernel(op, dtype_of_element<T>(), compute_capability);
  tsr_grouped::Params p{o.x.data(), gemm ? o.w.data() : o.dy.data(), ends.data(), out.data(), c.n, c.k, c.f, (long long)ends.size(),
                        c.row_offset};
  GroupedGemmParams host{p.x, p.other, p.ends, p.out, p.n, p.k, p.f, p.experts, p.row_offset};
  auto run = [&] {
    if constexpr (std::is_same_v<T, tsr_grouped::Bf16> || std::is_same_v<T, tsr_grouped::F16>)
      if (kernel.tensor_cores) return gemm ? tsr_grouped::grouped_gemm_mma<T>(p) : tsr_grouped::grouped_weight_grad_mma<T>(p);
    if (gemm) tsr_grouped::grouped_gemm<T>(p);
    else tsr_grouped::grouped_weight_grad<T>(p);
  };
  cuda_emulation::launch(kernel.blocks(host), kernel.threads(), kernel.shared_bytes(), run);
  std::vector<double> widened;
  for (const T& v : out) widened.push_back(to_double(v));
  return widened;
}

// The largest difference relative to the largest reference magnitude (at least 1).
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 1, worst = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]));
  return worst / scale;
}

const std::vector<Case> kCases = {
    // Two row tiles, two depth steps, two column tiles; group 1 empty; rows 66-69 in no group.
    {70, 20, 70, {10, 10, 45, 66}, 0},
    // The device's block holds global rows 30-99: group 0 lies before it, group 2's end goes back
    // (the running maximum keeps it empty), group 3 runs past the block's end.
    {70, 20, 70, {10, 50, 40, 120}, 30},
    // One row, one column, a reduced extent under one step, a single group.
    {1, 3, 1, {1}, 0},
    // No rows on this device: the weight gradient is zero.
    {0, 5, 7, {0, 0}, 0},
};

template <class T>
void check_against_reference() {
  std::mt19937 rng(11);
  for (const Case& c : kCases) {
    CAPTURE(describe(c));
    const Operands<T> o = random_operands<T>(c, rng);
    if (c.n > 0) CHECK(relative_error(emulated(LibraryOp::GroupedGemm, c, o), reference_gemm(c, o)) <= tolerance<T>());
    CHECK(relative_error(emulated(LibraryOp::GroupedWeightGradGemm, c, o), reference_weight_grad(c, o)) <= tolerance<T>());
  }
}

}  // namespace

TEST_CASE("the kernels' argument has grouped_gemm.cu's layout") {
  CHECK(sizeof(GroupedGemmParams) == sizeof(tsr_grouped::Params));
  CHECK(offsetof(GroupedGemmParams, ends) == offsetof(tsr_grouped::Params, ends));
  CHECK(offsetof(GroupedGemmParams, out) == offsetof(tsr_grouped::Params, out));
  CHECK(offsetof(GroupedGemmParams, experts) == offsetof(tsr_grouped::Params, experts));
  CHECK(offsetof(GroupedGemmParams, row_offset) == offsetof(tsr_grouped::Params, row_offset));
}

TEST_CASE("the CUDA grouped GEMMs, emulated on the CPU, equal their definition: f32, f64, bf16 and f16") {
  SUBCASE("f32") { check_against_reference<float>(); }
  SUBCASE("f64") { check_against_reference<double>(); }
  SUBCASE("bf16") { check_against_reference<tsr_grouped::Bf16>(); }
  SUBCASE("f16") { check_against_reference<tsr_grouped::F16>(); }
}

TEST_CASE("the experts' GEMM and its weight gradient on tensor cores, emulated, equal their definitions: bf16 and f16, uneven groups, tile edges, other devices' rows") {
  std::mt19937 rng(13);
  // Depths of several 32-index steps and of part of one; three column tiles; groups crossing row tiles.
  std::vector<Case> cases = kCases;
  cases.push_back({150, 70, 130, {5, 70, 70, 140, 150}, 0});
  for (const Case& c : cases) {
    if (c.n == 0) continue;
    CAPTURE(describe(c));
    const Operands<tsr_grouped::Bf16> b = random_operands<tsr_grouped::Bf16>(c, rng);
    CHECK(relative_error(emulated(LibraryOp::GroupedGemm, c, b, 90), reference_gemm(c, b)) <= tolerance<tsr_grouped::Bf16>());
    const Operands<tsr_grouped::F16> h = random_operands<tsr_grouped::F16>(c, rng);
    CHECK(relative_error(emulated(LibraryOp::GroupedGemm, c, h, 80), reference_gemm(c, h)) <= tolerance<tsr_grouped::F16>());
  }
  // The weight gradient too: every case, the device with no rows (zero gradients) included.
  for (const Case& c : cases) {
    CAPTURE(describe(c));
    const Operands<tsr_grouped::Bf16> b = random_operands<tsr_grouped::Bf16>(c, rng);
    CHECK(relative_error(emulated(LibraryOp::GroupedWeightGradGemm, c, b, 90), reference_weight_grad(c, b)) <= tolerance<tsr_grouped::Bf16>());
    const Operands<tsr_grouped::F16> h = random_operands<tsr_grouped::F16>(c, rng);
    CHECK(relative_error(emulated(LibraryOp::GroupedWeightGradGemm, c, h, 80), reference_weight_grad(c, h)) <= tolerance<tsr_grouped::F16>());
  }
  // A group's infinite weight stays in its own rows on tensor cores too.
  const Case c{40, 8, 9, {20, 40}, 0};
  Operands<tsr_grouped::Bf16> o = random_operands<tsr_grouped::Bf16>(c, rng);
  o.w[0] = from_double<tsr_grouped::Bf16>(std::numeric_limits<double>::infinity());
  const std::vector<double> out = emulated(LibraryOp::GroupedGemm, c, o, 90);
  for (int64_t r = 20; r < 40; ++r)
    for (int64_t j = 0; j < c.f; ++j) CHECK(std::isfinite(out[size_t(r * c.f + j)]));
  CHECK_FALSE(std::isfinite(out[0]));
}

TEST_CASE("the CUDA grouped GEMMs, emulated, agree with the CPU's kernels") {
  std::mt19937 rng(5);
  for (const Case& c : kCases) {
    if (c.n == 0) continue;
    CAPTURE(describe(c));
    const Operands<float> o = random_operands<float>(c, rng);
    const int64_t experts = int64_t(c.ends.size());
    const Array x = Array::from<float>(o.x, {c.n, c.k}), w = Array::from<float>(o.w, {experts, c.k, c.f}),
                dy = Array::from<float>(o.dy, {c.n, c.f}), ends = Array::from<int64_t>(c.ends, {experts});
    Array out({c.n, c.f}, DType::f32), grad({experts, c.k, c.f}, DType::f32);
    grouped_gemm(x, w, ends, c.row_offset, out, /*ordered=*/true);
    grouped_weight_grad_gemm(x, dy, ends, c.row_offset, grad, /*ordered=*/true);
    auto widened = [](const Array& a) {
      std::vector<double> v;
      for (float e : a.to_vector<float>()) v.push_back(e);
      return v;
    };
    CHECK(relative_error(emulated(LibraryOp::GroupedGemm, c, o), widened(out)) <= 1e-5);
    CHECK(relative_error(emulated(LibraryOp::GroupedWeightGradGemm, c, o), widened(grad)) <= 1e-5);
  }
}

TEST_CASE("a group's infinite weights reach no other group's rows") {
  const Case c{40, 8, 9, {20, 40}, 0};
  std::mt19937 rng(3);
  Operands<float> o = random_operands<float>(c, rng);
  o.w[0] = std::numeric_limits<float>::infinity();  // expert 0's first weight
  const std::vector<double> out = emulated(LibraryOp::GroupedGemm, c, o);
  for (int64_t r = 20; r < 40; ++r)
    for (int64_t j = 0; j < c.f; ++j) CHECK(std::isfinite(out[size_t(r * c.f + j)]));
  CHECK_FALSE(std::isfinite(out[0]));
}

TEST_CASE("a grouped GEMM's launch: a block per 64 x 64 output tile, none for an empty output; unsupported dtypes are DeviceErrors") {
  const GroupedGemmKernel gemm = grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::f32);
  const GroupedGemmKernel grad = grouped_gemm_kernel(LibraryOp::GroupedWeightGradGemm, DType::bf16);
  GroupedGemmParams p;
  p.n = 130, p.k = 65, p.f = 64, p.experts = 8;
  CHECK(gemm.blocks(p) == 3 * 1);
  CHECK(grad.blocks(p) == 8 * 2 * 1);
  p.n = 0;
  CHECK(gemm.blocks(p) == 0);
  CHECK(grad.blocks(p) == 16);  // no rows: the gradient is written, zero
  p.f = 0;
  CHECK(grad.blocks(p) == 0);
  CHECK(gemm.name() == "tessera_grouped_gemm_float32");
  CHECK(grad.shared_bytes() == (64 * 17 + 16 * 65) * 4);
  CHECK(grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::f64).shared_bytes() == (64 * 17 + 16 * 65) * 8);
  // Tensor cores: the experts' GEMM of bf16 and f16 from compute capability 8.0, outside deterministic mode.
  const GroupedGemmKernel mma = grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::bf16, 90);
  CHECK(mma.tensor_cores);
  CHECK(mma.threads() == 128);
  CHECK(mma.shared_bytes() == (64 * 40 + 32 * 72) * 2);
  CHECK(mma.name() == "tessera_grouped_gemm_mma_bfloat16");
  p.n = 130, p.f = 64;
  CHECK(mma.blocks(p) == 3 * 1);
  CHECK(grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::f16, 80).tensor_cores);
  CHECK(!grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::bf16, 90, /*ordered=*/true).tensor_cores);
  CHECK(!grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::bf16, 75).tensor_cores);
  CHECK(!grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::f32, 90).tensor_cores);
  const GroupedGemmKernel grad_mma = grouped_gemm_kernel(LibraryOp::GroupedWeightGradGemm, DType::bf16, 90);
  CHECK(grad_mma.tensor_cores);
  CHECK(grad_mma.name() == "tessera_grouped_weight_grad_mma_bfloat16");
  CHECK(grad_mma.shared_bytes() == mma.shared_bytes());
  CHECK(grad_mma.blocks(p) == 8 * 2 * 1);
  CHECK(!grouped_gemm_kernel(LibraryOp::GroupedWeightGradGemm, DType::f16, 90, /*ordered=*/true).tensor_cores);
  CHECK(grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::bf16).threads() == 256);
  CHECK_THROWS_WITH_AS(grouped_gemm_kernel(LibraryOp::GroupedGemm, DType::i32), doctest::Contains("int32 is not supported"), DeviceError);
  CHECK_THROWS_AS(grouped_gemm_kernel(LibraryOp::Gemm, DType::f32), InternalError);
}

TEST_CASE("the CUDA grouped GEMMs' source compiles with NVRTC: every dtype for sm_90, bf16 for sm_80, tensor cores' for both") {
  if (!nvrtc_available()) return;
  for (int arch : {80, 90})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16})
      for (LibraryOp op : {LibraryOp::GroupedGemm, LibraryOp::GroupedWeightGradGemm}) {
        if (arch == 80 && dtype != DType::bf16) continue;
        const GroupedGemmKernel k = grouped_gemm_kernel(op, dtype);
        INFO(k.name(), " for sm_", arch);
        const NvrtcOutput out = NvrtcCompiler(arch, false).compile_source(grouped_gemm_source(k), k.name() + ".cu");
        CHECK(!out.binary.empty());
        CHECK(out.log.find("spill") == std::string::npos);
      }
  for (int arch : {80, 90})
    for (DType dtype : {DType::bf16, DType::f16})
      for (LibraryOp op : {LibraryOp::GroupedGemm, LibraryOp::GroupedWeightGradGemm}) {
        const GroupedGemmKernel k = grouped_gemm_kernel(op, dtype, arch);
        REQUIRE(k.tensor_cores);
        INFO(k.name(), " for sm_", arch);
        const NvrtcOutput out = NvrtcCompiler(arch, false).compile_source(grouped_gemm_source(k), k.name() + ".cu");
        CHECK(!out.binary.empty());
        CHECK(out.log.find("spill") == std::string::npos);
      }
}
