// The CUDA flash-attention kernels without a GPU: backend/cuda/flash_attention.cu (CUDA cores)
// and flash_attention_mma.cu (tensor cores) compiled as C++ and run thread for thread on the CPU
// (test/cuda_emulation.hpp, whose tensor-core product takes the same fragments), against
// attention computed whole from its definition in f64, on the forward, dq and dk/dv, causal or
// not, with shifted masks, uneven tiles, narrow heads and every dtype; the host logic that picks
// an instantiation and sizes its shared memory; and the source NVRTC compiles for sm_80 and sm_90.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <random>
#include <tuple>
#include <vector>

#include "cuda_emulation.hpp"
// The kernels themselves, as C++ (uint16_t, the prelude's conversions and warp_mma.cu's products come from above).
#include "backend/cuda/storage_types.cu"
#include "backend/cuda/flash_attention.cu"
#include "backend/cuda/warp_fragments.cu"
#include "backend/cuda/flash_attention_mma.cu"
#include "cuda_storage_values.hpp"

#include "backend/cuda/cuda_flash_attention.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/nvrtc_library.hpp"
#include "nvrtc_available.hpp"
#include "dsl/error.hpp"

using namespace tessera;
using tessera::cuda_emulation::dtype_of_element;
using tessera::cuda_emulation::from_double;
using tessera::cuda_emulation::to_double;

namespace {

// Shared memory per block on the GPUs the planner knows (the opt-in limits of their datasheets).
constexpr int64_t kH100SharedBytes = 232448, kA100SharedBytes = 166912;

struct Case {
  int64_t batch, lq, lk, e, ev;
  bool causal;
  int64_t q_offset;
};

std::string describe(const Case& c) {
  return fmt::format("batch {} lq {} lk {} e {} ev {} causal {} q_offset {}", c.batch, c.lq, c.lk, c.e, c.ev, c.causal, c.q_offset);
}

// The reference: attention computed whole in f64 from its definition, every [lq, lk] score
// held. The gradients read the forward they are given (its logsumexp as the kernel stored it).
struct Reference {
  const Case& c;
  double scale;
  const std::vector<double>&q, &k, &v;

  bool visible(int64_t i, int64_t j) const { return !c.causal || j <= c.q_offset + i; }
  double score(int64_t b, int64_t i, int64_t j) const {
    double s = 0;
    for (int64_t d = 0; d < c.e; ++d) s += q[size_t((b * c.lq + i) * c.e + d)] * k[size_t((b * c.lk + j) * c.e + d)];
    return s * scale;
  }
  std::vector<double> forward() const {
    std::vector<double> out(size_t(c.batch * c.lq * (c.ev + 1)));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.lq; ++i) {
        double* o = out.data() + (b * c.lq + i) * (c.ev + 1);
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < c.lk; ++j)
          if (visible(i, j)) m = std::max(m, score(b, i, j));
        for (int64_t j = 0; j < c.lk; ++j) {
          if (!visible(i, j)) continue;
          const double p = std::exp(score(b, i, j) - m);
          l += p;
          for (int64_t d = 0; d < c.ev; ++d) o[d] += p * v[size_t((b * c.lk + j) * c.ev + d)];
        }
        for (int64_t d = 0; d < c.ev && l > 0; ++d) o[d] /= l;
        o[c.ev] = l > 0 ? m + std::log(l) : -INFINITY;
      }
    return out;
  }
  // dq [batch, lq, e] and dkv [batch, lk, e + ev] from the forward and its adjoint.
  std::pair<std::vector<double>, std::vector<double>> gradients(const std::vector<double>& fwd, const std::vector<double>& g) const {
    std::vector<double> dq(size_t(c.batch * c.lq * c.e)), dkv(size_t(c.batch * c.lk * (c.e + c.ev)));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.lq; ++i) {
        const double* o = fwd.data() + (b * c.lq + i) * (c.ev + 1);
        const double* gi = g.data() + (b * c.lq + i) * (c.ev + 1);
        double delta = -gi[c.ev];
        for (int64_t d = 0; d < c.ev; ++d) delta += gi[d] * o[d];
        for (int64_t j = 0; j < c.lk; ++j) {
          if (!visible(i, j)) continue;
          const double p = std::exp(score(b, i, j) - o[c.ev]);
          double dp = 0;
          for (int64_t d = 0; d < c.ev; ++d) dp += gi[d] * v[size_t((b * c.lk + j) * c.ev + d)];
          const double ds = p * (dp - delta);
          double* kv = dkv.data() + (b * c.lk + j) * (c.e + c.ev);
          for (int64_t d = 0; d < c.e; ++d) {
            dq[size_t((b * c.lq + i) * c.e + d)] += scale * ds * k[size_t((b * c.lk + j) * c.e + d)];
            kv[d] += scale * ds * q[size_t((b * c.lq + i) * c.e + d)];
          }
          for (int64_t d = 0; d < c.ev; ++d) kv[c.e + d] += p * gi[d];
        }
      }
    return {dq, dkv};
  }
};

template <class T>
std::vector<T> random_elements(int64_t n, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> out(static_cast<size_t>(n));
  for (T& x : out) x = from_double<T>(normal(rng));
  return out;
}
template <class T>
std::vector<double> widened(const std::vector<T>& xs) {
  std::vector<double> out;
  for (const T& x : xs) out.push_back(to_double(x));
  return out;
}

// The kernels' tolerance, relative to the largest reference magnitude: results are f32 (f64 for
// f64 data) summed in another order than the reference and exponentiated with another function;
// on tensor cores the probabilities, their gradients and the forward's adjoint enter the
// products rounded to the data's 16 bits (bf16 keeps 8 bits, f16 11).
template <class T>
double tolerance(bool tensor_cores) {
  if constexpr (std::is_same_v<T, double>) return 1e-11;
  if (tensor_cores) return std::is_same_v<T, tsr_attention::Bf16> ? 1e-2 : 2e-3;
  return 2e-5;
}

template <class A>
void check_close(const std::vector<A>& got, const std::vector<double>& want, double tolerance, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double largest = 1e-30;
  for (double w : want)
    if (std::isfinite(double(w))) largest = std::max(largest, std::abs(double(w)));
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = to_double(got[i]), w = double(want[i]);
    const bool same = std::isinf(w) ? g == w : std::abs(g - w) <= tolerance * largest;
    if (!same && bad++ == 0) first_bad = i;
  }
  INFO(what, ": ", bad, " of ", got.size(), " elements off; the first at ", first_bad, ": ", to_double(got[first_bad]), " against ",
       double(want[first_bad]));
  CHECK(bad == 0);
}

// Runs all three parts on `c` through the emulation, each by `launch(part, params)`, and checks
// each against attention computed whole. q, k and v are T; the results, the forward the gradients
// read and its adjoint are the sums' type A (the primitive's contract, dsl/attention.hpp).
template <class T, class Launch>
void run_and_check(const Case& c, bool tensor_cores, const Launch& launch) {
  using A = typename tsr_storage::SumType<T>::type;
  std::mt19937 rng(unsigned(c.lq * 131 + c.lk * 7 + c.e + c.causal));
  const std::vector<T> q = random_elements<T>(c.batch * c.lq * c.e, rng), k = random_elements<T>(c.batch * c.lk * c.e, rng),
                       v = random_elements<T>(c.batch * c.lk * c.ev, rng);
  const std::vector<A> d_out = random_elements<A>(c.batch * c.lq * (c.ev + 1), rng);
  const std::vector<double> rq = widened(q), rk = widened(k), rv = widened(v);
  const double scale = 1.0 / std::sqrt(double(c.e));
  const Reference reference{c, scale, rq, rk, rv};

  tsr_attention::Params p{};
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.d_out = d_out.data();
  p.batch = c.batch;
  p.lq = c.lq;
  p.lk = c.lk;
  p.e = c.e;
  p.ev = c.ev;
  p.q_offset = c.q_offset;
  p.scale = scale;
  p.causal = c.causal;

  const double tolerance_now = tolerance<T>(tensor_cores);
  std::vector<A> forward(size_t(c.batch * c.lq * (c.ev + 1)));
  p.out = forward.data();
  launch(AttentionPart::Forward, p);
  check_close(forward, reference.forward(), tolerance_now, "forward");

  // The gradients take the forward as the kernel wrote it, as the library's would.
  p.forward = forward.data();
  const auto [want_dq, want_dkv] = reference.gradients(widened(forward), widened(d_out));
  std::vector<A> dq(size_t(c.batch * c.lq * c.e));
  p.out = dq.data();
  launch(AttentionPart::GradQ, p);
  check_close(dq, want_dq, tolerance_now, "dq");

  std::vector<A> dkv(size_t(c.batch * c.lk * (c.e + c.ev)));
  p.out = dkv.data();
  launch(AttentionPart::GradKV, p);
  check_close(dkv, want_dkv, tolerance_now, "dk, dv");
}

// The CUDA cores' kernels of one instantiation on `c`, after checking that the host picks this
// instantiation for the case's heads (on a GPU without tensor cores).
template <class T, int TILE, int CE, int CV>
void check_case(const Case& c, int64_t shared_limit = kH100SharedBytes) {
  INFO(describe(c), " on ", dtype_name(dtype_of_element<T>()));
  for (AttentionPart part : {AttentionPart::Forward, AttentionPart::GradQ, AttentionPart::GradKV}) {
    const FlashAttentionKernel k = flash_attention_kernel(part, dtype_of_element<T>(), c.e, c.ev, shared_limit);
    CHECK(!k.tensor_cores);
    CHECK(k.tile == TILE);
    CHECK(k.e_columns == CE);
    CHECK(k.ev_columns == CV);
  }
  run_and_check<T>(c, false, [&](AttentionPart part, const tsr_attention::Params& p) {
    const FlashAttentionKernel chosen = flash_attention_kernel(part, dtype_of_element<T>(), c.e, c.ev, shared_limit);
    auto run = [&] {
      switch (part) {
        case AttentionPart::Forward: tsr_attention::forward<T, TILE, CE, CV>(p); break;
        case AttentionPart::GradQ: tsr_attention::grad_q<T, TILE, CE, CV>(p); break;
        case AttentionPart::GradKV: tsr_attention::grad_kv<T, TILE, CE, CV>(p); break;
      }
    };
    cuda_emulation::launch(chosen.blocks(c.batch, c.lq, c.lk), chosen.threads(), chosen.shared_bytes(), run);
  });
}

// The tensor-core kernels for heads rounded up to DE and DV columns on `c`, as an H100 (sm_90)
// picks them.
template <class T, int DE, int DV>
void check_case_on_tensor_cores(const Case& c) {
  INFO(describe(c), " on ", dtype_name(dtype_of_element<T>()), ", tensor cores");
  for (AttentionPart part : {AttentionPart::Forward, AttentionPart::GradQ, AttentionPart::GradKV}) {
    const FlashAttentionKernel k = flash_attention_kernel(part, dtype_of_element<T>(), c.e, c.ev, kH100SharedBytes, 90);
    CHECK(k.tensor_cores);
    CHECK(k.tile == 64);
    CHECK(16 * k.e_columns == DE);
    CHECK(16 * k.ev_columns == DV);
  }
  run_and_check<T>(c, true, [&](AttentionPart part, const tsr_attention::Params& p) {
    const FlashAttentionKernel chosen = flash_attention_kernel(part, dtype_of_element<T>(), c.e, c.ev, kH100SharedBytes, 90);
    auto run = [&] {
      switch (part) {
        case AttentionPart::Forward: tsr_attention::forward_mma<T, DE, DV>(p); break;
        case AttentionPart::GradQ: tsr_attention::grad_q_mma<T, DE, DV>(p); break;
        case AttentionPart::GradKV: tsr_attention::grad_kv_mma<T, DE, DV>(p); break;
      }
    };
    cuda_emulation::launch(chosen.blocks(c.batch, c.lq, c.lk), chosen.threads(), chosen.shared_bytes(), run);
  });
}

}  // namespace

TEST_CASE("the CUDA flash attention, emulated on the CPU, equals the CPU's fused kernel: f32, causal or not, uneven tiles") {
  // Several query and key tiles with partial last ones; lq != lk; e != ev.
  check_case<float, 64, 2, 3>({2, 70, 90, 32, 40, false, 0});
  check_case<float, 64, 2, 3>({2, 70, 90, 32, 40, true, 0});
  // Heads narrower than a thread's 16 columns, one row, one key.
  check_case<float, 64, 1, 1>({3, 1, 1, 5, 7, false, 0});
  check_case<float, 64, 1, 1>({1, 17, 65, 16, 16, true, 0});
}

TEST_CASE("the CUDA flash attention, emulated: shifted causal masks (ring attention's blocks), queries that see no key") {
  // Queries placed after the keys (a later block of a sharded sequence) and before them: those
  // before key 0 see nothing (output 0, logsumexp -inf), and their gradients are 0.
  check_case<float, 64, 1, 1>({2, 40, 50, 16, 16, true, 30});
  check_case<float, 64, 1, 1>({2, 40, 50, 16, 16, true, -25});
  check_case<float, 64, 1, 1>({1, 20, 30, 16, 16, true, -100});
  check_case<float, 64, 1, 1>({1, 20, 30, 16, 16, true, 1000});
}

TEST_CASE("the CUDA flash attention, emulated: f64, bf16 and f16 data, wide heads, smaller tiles under smaller limits") {
  check_case<double, 64, 2, 2>({1, 40, 70, 32, 32, true, 0});
  check_case<tsr_attention::Bf16, 64, 4, 4>({2, 33, 65, 64, 64, true, 0});
  check_case<tsr_attention::F16, 64, 4, 4>({1, 33, 65, 64, 50, false, 0});
  // 128-wide heads (Llama's) take the tile of 64 on an H100 and an A100; 256 take 32 on an A100.
  check_case<float, 64, 8, 8>({1, 65, 70, 128, 128, true, 0});
  check_case<float, 64, 8, 8>({1, 65, 70, 128, 128, true, 0}, kA100SharedBytes);
  check_case<float, 32, 16, 13>({1, 40, 33, 256, 200, false, 0}, kA100SharedBytes);
}

TEST_CASE("the CUDA flash attention on tensor cores, emulated: bf16 and f16, causal or not, shifted masks, uneven tiles and heads") {
  using tsr_attention::Bf16;
  using tsr_attention::F16;
  // Several query and key tiles with partial last ones; lq != lk; e != ev, neither a multiple of 16.
  check_case_on_tensor_cores<Bf16, 32, 48>({2, 70, 90, 32, 40, false, 0});
  check_case_on_tensor_cores<Bf16, 32, 48>({2, 70, 90, 32, 40, true, 0});
  check_case_on_tensor_cores<F16, 16, 16>({3, 1, 1, 5, 7, false, 0});
  // Ring attention's shifted blocks; queries that see no key (output 0, logsumexp -inf).
  check_case_on_tensor_cores<Bf16, 16, 16>({2, 40, 50, 16, 16, true, 30});
  check_case_on_tensor_cores<Bf16, 16, 16>({2, 40, 50, 16, 16, true, -25});
  check_case_on_tensor_cores<F16, 16, 16>({1, 20, 30, 16, 16, true, 1000});
  // Rows read eight elements at a time (heads a multiple of 8), and Llama's heads of 128.
  check_case_on_tensor_cores<F16, 64, 64>({1, 33, 65, 64, 50, false, 0});
  check_case_on_tensor_cores<Bf16, 128, 128>({1, 65, 130, 128, 128, true, 0});
}

TEST_CASE("the CUDA flash attention's host side: its argument's layout, the instantiation and shared memory it picks, its refusals") {
  CHECK(sizeof(tsr_attention::Params) == sizeof(FlashAttentionParams));
  CHECK(offsetof(tsr_attention::Params, out) == offsetof(FlashAttentionParams, out));
  CHECK(offsetof(tsr_attention::Params, q_offset) == offsetof(FlashAttentionParams, q_offset));
  CHECK(offsetof(tsr_attention::Params, scale) == offsetof(FlashAttentionParams, scale));
  CHECK(offsetof(tsr_attention::Params, causal) == offsetof(FlashAttentionParams, causal));

  // f32 heads of 128: q, k [64][129] and v [64][129] and p [64][64] for the forward; dk/dv's
  // kernel holds two more tiles and two score tiles.
  const FlashAttentionKernel forward = flash_attention_kernel(AttentionPart::Forward, DType::f32, 128, 128, kH100SharedBytes);
  CHECK(forward.shared_bytes() == (3 * 64 * 129 + 64 * 64) * 4);
  CHECK(forward.name() == "tessera_flash_attention_forward_f32_t64_e8_v8");
  CHECK(forward.blocks(16, 1000, 4000) == 16 * 16);
  const FlashAttentionKernel grad_kv = flash_attention_kernel(AttentionPart::GradKV, DType::f32, 128, 128, kH100SharedBytes);
  CHECK(grad_kv.shared_bytes() == (4 * 64 * 129 + 2 * 64 * 64 + 2 * 64) * 4);
  CHECK(grad_kv.blocks(16, 1000, 4000) == 16 * 63);
  // f64 sums take twice the bytes: heads of 128 fit 64-row tiles on an H100, not on an A100.
  CHECK(flash_attention_kernel(AttentionPart::Forward, DType::f64, 128, 128, kH100SharedBytes).tile == 64);
  CHECK(flash_attention_kernel(AttentionPart::GradKV, DType::f64, 128, 128, kA100SharedBytes).tile == 32);
  CHECK(flash_attention_kernel(AttentionPart::GradQ, DType::bf16, 100, 20, kH100SharedBytes).e_columns == 7);

  // Tensor cores: bf16 and f16 heads of up to 128 on compute capability 8.0 and later; 16-bit
  // tiles of rows 136 apart (q, k and v; q, d_out, k and v with f32 logsumexp and delta rows).
  const FlashAttentionKernel mma = flash_attention_kernel(AttentionPart::Forward, DType::bf16, 128, 128, kH100SharedBytes, 90);
  CHECK(mma.tensor_cores);
  CHECK(mma.threads() == 128);
  CHECK(mma.shared_bytes() == 3 * 64 * 136 * 2);
  CHECK(mma.name() == "tessera_flash_attention_mma_forward_bf16_t64_e8_v8");
  CHECK(mma.blocks(16, 1000, 4000) == 16 * 16);
  const FlashAttentionKernel mma_kv = flash_attention_kernel(AttentionPart::GradKV, DType::f16, 100, 20, kA100SharedBytes, 80);
  CHECK(mma_kv.tensor_cores);
  CHECK(mma_kv.shared_bytes() == (2 * 64 * 120 + 2 * 64 * 40) * 2 + 2 * 64 * 4);
  CHECK(mma_kv.blocks(16, 1000, 4000) == 16 * 63);
  CHECK(!flash_attention_kernel(AttentionPart::Forward, DType::f32, 128, 128, kH100SharedBytes, 90).tensor_cores);
  CHECK(!flash_attention_kernel(AttentionPart::Forward, DType::bf16, 128, 128, kH100SharedBytes, 75).tensor_cores);
  CHECK(!flash_attention_kernel(AttentionPart::GradQ, DType::bf16, 129, 128, kH100SharedBytes, 90).tensor_cores);
  CHECK(flash_attention_kernel(AttentionPart::Forward, DType::bf16, 128, 128, kH100SharedBytes).threads() == 256);
  // A limit the tensor-core tiles do not fit falls back to the CUDA cores' smaller tiles.
  const FlashAttentionKernel small = flash_attention_kernel(AttentionPart::GradKV, DType::bf16, 128, 128, 60000, 90);
  CHECK(!small.tensor_cores);
  CHECK(small.tile == 16);

  CHECK_THROWS_AS(flash_attention_kernel(AttentionPart::Forward, DType::f32, 257, 64, kH100SharedBytes), DeviceError);
  CHECK_THROWS_WITH(flash_attention_kernel(AttentionPart::Forward, DType::i32, 64, 64, kH100SharedBytes),
                    doctest::Contains("int32 is not supported"));
  CHECK_THROWS_WITH(flash_attention_kernel(AttentionPart::GradKV, DType::f32, 64, 64, 4096), doctest::Contains("shared memory"));
}

TEST_CASE("the CUDA flash attention's source compiles with NVRTC: every part and dtype for sm_90, bf16's for sm_80, tensor cores' for both") {
  if (!nvrtc_available()) return;
  // Each compile takes a second or two, so the A100's architecture gets the mixed-precision dtype.
  for (int arch : {80, 90})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16})
      for (AttentionPart part : {AttentionPart::Forward, AttentionPart::GradQ, AttentionPart::GradKV}) {
        if (arch == 80 && dtype != DType::bf16) continue;
        const FlashAttentionKernel k = flash_attention_kernel(part, dtype, 128, 128, arch == 90 ? kH100SharedBytes : kA100SharedBytes);
        INFO(k.name(), " for sm_", arch);
        const NvrtcOutput out = NvrtcCompiler(arch, false).compile_source(flash_attention_source(k), k.name() + ".cu");
        CHECK(!out.binary.empty());
        // Spilled registers are slow; the log says where NVRTC spilled (it does not with these tiles).
        CHECK(out.log.find("spill") == std::string::npos);
      }
  // The tensor-core kernels: bf16 and f16 heads of 128 for sm_90, bf16 heads of 40 (rounded up
  // to 48) for sm_80.
  for (const auto& [arch, dtype, head] : {std::tuple{90, DType::bf16, 128}, std::tuple{90, DType::f16, 128}, std::tuple{80, DType::bf16, 40}})
    for (AttentionPart part : {AttentionPart::Forward, AttentionPart::GradQ, AttentionPart::GradKV}) {
      const FlashAttentionKernel k = flash_attention_kernel(part, dtype, head, head, arch == 90 ? kH100SharedBytes : kA100SharedBytes, arch);
      REQUIRE(k.tensor_cores);
      INFO(k.name(), " for sm_", arch);
      const NvrtcOutput out = NvrtcCompiler(arch, false).compile_source(flash_attention_source(k), k.name() + ".cu");
      CHECK(!out.binary.empty());
    }
}
