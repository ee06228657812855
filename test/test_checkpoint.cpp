// Activation checkpointing (dsl/checkpoint.hpp): gradients bitwise those without it, the memory
// it saves shown exactly by the plan and measured, on 1-D and 2-D meshes, both policies.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include <tessera/tessera.hpp>

#include "jit/executable.hpp"
#include "plan_checks.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::vector<std::pair<std::string, int64_t>> dims_of(int devices, bool two_d) {
  if (two_d) return {{"dp", 2}, {"tp", devices / 2}};
  return {{"dp", devices}};
}

// Six blocks of x -> x + dense2(gelu(dense1(layer_norm(x)))), alternating between two pairs of
// weights, on `mesh` (hidden units sharded over tp on 2-D meshes); the loss and the weights'
// gradients.
struct Blocks {
  Mesh mesh;
  Tensor x;
  std::vector<Tensor> w;
  Blocks(const Mesh& m, int64_t batch, int64_t width) : mesh(m) {
    const bool two_d = m.ndim() > 1;
    x = random_normal({batch, width}, 1, Layout({"dp", UNSHARDED}, m));
    for (int b = 0; b < 2; ++b) {
      w.push_back(random_normal({width, 4 * width}, 10 + b, Layout({UNSHARDED, two_d ? "tp" : UNSHARDED}, m), 0, 0.1));
      w.push_back(random_normal({4 * width, width}, 20 + b, Layout({two_d ? "tp" : UNSHARDED, UNSHARDED}, m), 0, 0.1));
    }
  }
  static Tensor block(const Tensor& x, const Tensor& w1, const Tensor& w2) {
    return x + matmul(gelu(matmul(layer_norm(x), w1)), w2);
  }
  static std::vector<Tensor> step(const Tensor& x, const std::vector<Tensor>& weights, std::optional<CheckpointPolicy> policy) {
    Tensor h = x;
    for (size_t b = 0; b < 6; ++b) {
      const Tensor &w1 = weights[2 * (b % 2)], &w2 = weights[2 * (b % 2) + 1];
      h = policy ? checkpoint(block, *policy)(h, w1, w2) : block(h, w1, w2);
    }
    const Tensor loss = reduce_mean(tanh(h) * h);
    std::vector<Tensor> out = gradients(loss, weights);
    out.insert(out.begin(), loss);
    return out;
  }
  static auto function(std::optional<CheckpointPolicy> policy) {
    return jit([policy](const Tensor& x, const Tensor& a1, const Tensor& a2, const Tensor& b1, const Tensor& b2) {
      return step(x, {a1, a2, b1, b2}, policy);
    });
  }
  template <class F>
  std::vector<Tensor> operator()(const F& f) const {
    return f(x, w[0], w[1], w[2], w[3]);
  }
};

}  // namespace

TEST_CASE("checkpointed gradients are those without checkpointing, bitwise under TESSERA_DETERMINISTIC, on 1-D and 2-D meshes") {
  for (const bool deterministic : {true, false}) {
    if (deterministic) setenv("TESSERA_DETERMINISTIC", "1", 1);
    for (const auto& [devices, two_d] : {std::pair{1, false}, std::pair{2, false}, std::pair{3, false}, std::pair{4, true}}) {
      const Mesh mesh = create_mesh(dims_of(devices, two_d), cpu_devices(devices));
      CAPTURE(mesh.to_string());
      CAPTURE(deterministic);
      const Blocks s(mesh, 10, 16);  // uneven over 3 and 4
      const std::vector<Tensor> expected = s(Blocks::function(std::nullopt));
      for (CheckpointPolicy policy : {CheckpointPolicy::Full, CheckpointPolicy::Selective}) {
        CAPTURE(std::string(checkpoint_policy_name(policy)));
        const std::vector<Tensor> got = s(Blocks::function(policy));
        REQUIRE(got.size() == expected.size());
        for (size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);
          CHECK(got[i].layout() == expected[i].layout());
          const Array a = got[i].full_tensor(), b = expected[i].full_tensor();
          if (deterministic) {
            CHECK(same_array(a, b));
            continue;
          }
          // Otherwise a reduction recomputed inside another kernel may sum in another order.
          const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
          for (size_t e = 0; e < x.size(); ++e) CHECK(x[e] == doctest::Approx(y[e]).epsilon(1e-4).scale(1e-3));
        }
      }
    }
    unsetenv("TESSERA_DETERMINISTIC");
  }
}

TEST_CASE("checkpointing lowers the peak by what the plan says, measured to the byte") {
  for (const auto& [devices, two_d] : {std::pair{1, false}, std::pair{2, false}, std::pair{4, true}}) {
    const Mesh mesh = create_mesh(dims_of(devices, two_d), cpu_devices(devices));
    CAPTURE(mesh.to_string());
    const Blocks s(mesh, 256, 32);
    auto plain = Blocks::function(std::nullopt), full = Blocks::function(CheckpointPolicy::Full),
         selective = Blocks::function(CheckpointPolicy::Selective);
    auto plan = [&](const auto& f) { return f.plan(s.x, s.w[0], s.w[1], s.w[2], s.w[3]); };
    const int64_t none_peak = plan(plain).peak_bytes, full_peak = plan(full).peak_bytes, selective_peak = plan(selective).peak_bytes;
    MESSAGE("peak bytes: none " << none_peak << ", selective " << selective_peak << ", full " << full_peak);
    // Both keep less than none; which of the two is lower depends on what the backward's peak
    // holds besides (full recomputes more, and holds its recomputed values there).
    CHECK(full_peak < none_peak);
    CHECK(selective_peak < none_peak);
    for (const auto* f : {&plain, &full, &selective})
      check_plan_is_measured(mesh, [&] { return plan(*f); }, [&] { (void)s(*f); });
  }
}

TEST_CASE("the GPT training step with checkpointed blocks: the same losses, bitwise, in every parallel style, and less memory") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  struct Case {
    std::vector<std::pair<std::string, int64_t>> dims;
    bool sequence_parallel = false, fsdp = false;
  };
  for (const Case& c : {Case{{{"dp", 1}}}, Case{{{"dp", 2}}, false, true}, Case{{{"sp", 2}}}, Case{{{"dp", 2}, {"tp", 2}}, true, true}}) {
    const int devices = int(mesh_device_count(c.dims));
    const Mesh mesh = create_mesh(c.dims, cpu_devices(devices));
    CAPTURE(mesh.to_string());
    GptConfig config;
    config.vocab = 24, config.context = 32, config.layers = 2, config.width = 32, config.heads = 4;
    const auto [ids, targets] = gpt_batch(mesh, config, 16);  // activations outweigh the weights
    auto losses = [&](std::optional<CheckpointPolicy> policy, int64_t* peak) {
      GptConfig with = config;
      with.activation_checkpointing = policy;
      GptTrainingStep step(with, mesh, c.sequence_parallel, c.fsdp);
      std::vector<Array> out;
      for (int i = 0; i < 2; ++i) out.push_back(step(ids, targets).full_tensor());
      *peak = step.plan(ids, targets).peak_bytes;
      return out;
    };
    int64_t none_peak = 0, full_peak = 0, selective_peak = 0;
    const std::vector<Array> expected = losses(std::nullopt, &none_peak);
    const std::vector<Array> full = losses(CheckpointPolicy::Full, &full_peak);
    const std::vector<Array> selective = losses(CheckpointPolicy::Selective, &selective_peak);
    for (size_t i = 0; i < expected.size(); ++i) {
      CHECK(same_array(full[i], expected[i]));
      CHECK(same_array(selective[i], expected[i]));
    }
    MESSAGE("GPT peak bytes: none " << none_peak << ", selective " << selective_peak << ", full " << full_peak);
    CHECK(full_peak < none_peak);
    CHECK(selective_peak < none_peak);
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("with FSDP, checkpointed blocks gather their parameters again for the backward: the forward's die after it") {
  // FSDP2's reshard after forward: the forward's gathered weights are freed once the forward has
  // read them, and the recomputed forward of the backward gathers them again.
  {
    const Mesh mesh = create_mesh({{"dp", 2}}, cpu_devices(2));
    GptConfig config;
    config.vocab = 24, config.context = 16, config.layers = 2, config.width = 64, config.heads = 4;
    const auto [ids, targets] = gpt_batch(mesh, config, 4);  // few tokens: the weights dominate
    auto gathers = [](const Executable& exe) {
      const std::vector<std::string> collectives = plan_summary(exe).collectives;
      return std::count_if(collectives.begin(), collectives.end(), [](const std::string& c) { return c.rfind("all_gather", 0) == 0; });
    };
    std::map<std::string, std::pair<int64_t, int64_t>> seen;  // policy -> {all_gathers, peak bytes}
    for (const auto& [name, policy] : {std::pair{"none", std::optional<CheckpointPolicy>{}}, std::pair{"full", std::optional{CheckpointPolicy::Full}}}) {
      GptConfig with = config;
      with.activation_checkpointing = policy;
      GptTrainingStep step(with, mesh, /*sequence_parallel=*/false, /*fsdp=*/true);
      seen[name] = {gathers(*step.executable(ids, targets)), step.plan(ids, targets).peak_bytes};
      check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); });
    }
    MESSAGE("all_gathers / peak bytes: none " << seen["none"].first << " / " << seen["none"].second << ", full "
                                             << seen["full"].first << " / " << seen["full"].second);
    // Each block's weights and biases are gathered a second time.
    CHECK(seen["full"].first >= seen["none"].first + 4 * config.layers);
    CHECK(seen["full"].second < seen["none"].second);
  }
}
