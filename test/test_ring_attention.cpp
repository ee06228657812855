// Ring attention (dsl/ring_attention.hpp): values and gradients against one device's attention
// and the reference evaluator on 1-D and 2-D meshes, causal (head-tail balanced) or not; the
// collectives it runs; memory per device falling as 1/cp; composition with heads over tp and
// batch over dp; typed errors. Also the fused attention's pieces it stands on: the mask shift and
// the logsumexp's gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <random>

#include <tessera/tessera.hpp>

#include "plan_checks.hpp"
#include "random_arrays.hpp"
#include "reference_evaluator.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// A mesh with a ring dim "cp", and the placements of [batch, heads, L, E] inputs on it: the
// sequence over cp, and on a 2-D mesh the batch (dp) or the heads (tp) over the other dim.
struct RingLayout {
  Mesh mesh;
  std::vector<Placement> placements;
};

std::vector<RingLayout> ring_layouts() {
  return {{create_mesh({{"cp", 2}}), {Shard{2}}},
          {create_mesh({{"cp", 3}}), {Shard{2}}},
          {create_mesh({{"cp", 4}}), {Shard{2}}},
          {create_mesh({{"dp", 2}, {"cp", 2}}), {Shard{0}, Shard{2}}},
          {create_mesh({{"cp", 2}, {"tp", 2}}), {Shard{2}, Shard{1}}},
          {create_mesh({{"tp", 3}, {"cp", 2}}), {Shard{1}, Shard{2}}}};  // 2 heads over 3: replicated
}

std::map<std::string, int64_t> counts_by_dim(const CommDebugMode& comm) {
  std::map<std::string, int64_t> out;
  for (const CollectiveRecord& r : comm.records()) ++out[r.kind + " over " + r.mesh_dim];
  return out;
}

}  // namespace

TEST_CASE("the fused attention's mask shift: key j is visible to query i when j <= i + shift; a query that sees none is 0, lse -inf") {
  std::mt19937 rng(1);
  const Mesh mesh = create_mesh({{"x", 1}});
  const Array q = random_f32({2, 40, 8}, rng), k = random_f32({2, 70, 8}, rng), v = random_f32({2, 70, 6}, rng);
  const Array w = random_f32({2, 40, 7}, rng);
  for (int64_t shift : {-100, -45, -13, 0, 9, 40, 200}) {
    CAPTURE(shift);
    auto on = [&](const Array& a) { return distribute_tensor(a, mesh, {Replicate{}}); };
    const Tensor tq = on(q), tk = on(k), tv = on(v);
    const Tensor s = distribute_tensor(Array::from<int64_t>({shift}, {}), mesh, {Replicate{}});
    const Tensor f = detail::attention_with_logsumexp(tq, tk, tv, true, 0.3, s, SourceLocation::current());
    // The logsumexp column is used (weighted like an output column), so its adjoint reaches
    // the parts: ring attention's merge needs exactly that.
    const Tensor finite = where(f > Operand(-INFINITY), Operand(f), Operand(0.0));
    const std::vector<Tensor> grads = gradients(reduce_sum(finite * on(w)), {tq, tk, tv});
    CHECK(compare_with_reference(f.full_tensor(), reference_eval(f), 2e-5) == "");
    for (const Tensor& g : grads) CHECK(compare_with_reference(g.full_tensor(), reference_eval(g), 2e-5) == "");
    // Against the definition built from ordinary ops (the math a GPU mesh runs).
    const Tensor from_ops(detail::attention_part_from_ops(attention_attrs(f.node()->attrs), f.node()->inputs, SourceLocation::current()));
    const Array a = f.full_tensor(), b = from_ops.full_tensor();
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    int64_t hidden = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      if (std::isinf(pa[i])) {
        CHECK(pb[i] == pa[i]);
        ++hidden;
      } else {
        CHECK(std::abs(pa[i] - pb[i]) < 2e-5);
      }
    }
    CHECK((hidden > 0) == (shift < 0));  // queries before the first key see none
  }
}

TEST_CASE("ring_attention equals one device's attention: values and gradients, causal or not, on 1-D and 2-D meshes") {
  std::mt19937 rng(2);
  // 48 rows: 2n chunks for n = 2, 3, 4 (chunks of 12, 8, 6 rows); 160 rows cross the kernel's
  // query blocks (32) and key tiles (64) inside a chunk.
  for (const int64_t length : {48, 160}) {
    const Array q = random_f32({2, 2, length, 8}, rng), k = random_f32({2, 2, length, 8}, rng);
    const Array v = random_f32({2, 2, length, 5}, rng), w = random_f32({2, 2, length, 5}, rng);
    for (const RingLayout& layout : ring_layouts()) {
      if (length == 160 && layout.mesh.size() != 2 && layout.mesh.ndim() == 1) continue;  // 160 = 2 * 2 * 40 only
      for (bool causal : {false, true}) {
        CAPTURE(length);
        CAPTURE(layout.mesh.to_string());
        CAPTURE(causal);
        auto on = [&](const Array& a) { return distribute_tensor(a, layout.mesh, layout.placements); };
        const Tensor tq = on(q), tk = on(k), tv = on(v), tw = on(w);
        const Tensor out = ring_attention(tq, tk, tv, causal, "cp");
        const bool heads_replicated = layout.mesh.contains_dim("tp") && layout.mesh.shape()[size_t(layout.mesh.dim_index("tp"))] == 3;
        if (!heads_replicated) CHECK(out.placements() == layout.placements);
        else CHECK(out.placements() == std::vector<Placement>{Replicate{}, Shard{2}});  // 2 heads do not split over 3
        std::vector<Tensor> got = gradients(reduce_sum(out * tw), {tq, tk, tv});
        got.insert(got.begin(), out);
        const Mesh one = create_mesh({{"x", 1}});
        auto whole = [&](const Array& a) { return distribute_tensor(a, one, {Replicate{}}); };
        SdpaKernel flash({SdpBackend::Flash});
        const Tensor wq = whole(q), wk = whole(k), wv = whole(v);
        const Tensor expected = scaled_dot_product_attention(wq, wk, wv, causal);
        std::vector<Tensor> want = gradients(reduce_sum(expected * whole(w)), {wq, wk, wv});
        want.insert(want.begin(), expected);
        for (size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);  // out, dq, dk, dv
          const Array g = got[i].full_tensor();
          CHECK(max_difference(g, want[i].full_tensor()) < 3e-5);
          CHECK(compare_with_reference(g, reference_eval(got[i]), 3e-5) == "");
        }
      }
    }
  }
}

TEST_CASE("ring_attention's collectives: keys and values in n-1 steps forward, with their adjoints n back, 2 head-tail swaps each way; none over tp or dp") {
  std::mt19937 rng(3);
  const int64_t length = 48, e = 8;
  for (const RingLayout& layout : ring_layouts()) {
    const int64_t n = layout.mesh.shape()[size_t(layout.mesh.dim_index("cp"))];
    for (bool causal : {false, true}) {
      CAPTURE(layout.mesh.to_string());
      CAPTURE(causal);
      auto on = [&](const Array& a) { return distribute_tensor(a, layout.mesh, layout.placements); };
      const Tensor tq = on(random_f32({2, 2, length, e}, rng)), tk = on(random_f32({2, 2, length, e}, rng));
      const Tensor tv = on(random_f32({2, 2, length, e}, rng));
      const bool heads_replicated = layout.mesh.contains_dim("tp") && layout.mesh.shape()[size_t(layout.mesh.dim_index("tp"))] == 3;
      auto step = jit([causal](const Tensor& q, const Tensor& k, const Tensor& v) {
        const Tensor out = ring_attention(q, k, v, causal, "cp");
        std::vector<Tensor> all = gradients(reduce_sum(out), {q, k, v});
        all.push_back(out);
        return all;
      });
      (void)step(tq, tk, tv);  // compiled
      CommDebugMode comm;
      for (const Tensor& t : step(tq, tk, tv)) (void)t.to_local();
      // Forward: n-1 steps move the keys and the values. Backward: n-1 steps move them the other
      // way round the ring with their adjoints' running sums, and one more step takes the sums
      // home. Causal, each of those moves is of the two head-tail parts, and head-tail swaps
      // the second halves of q, k and v in (one swap) and the outputs with their logsumexps out,
      // and in the backward q, k, v, the forward's rows and their adjoints in, the gradients out.
      const int64_t parts = causal ? 2 : 1, swaps = causal ? 4 : 0;
      std::map<std::string, int64_t> want = {{"shift over cp", parts * (2 * (n - 1) + 3 * (n - 1) + 1) + swaps}};
      // 2 heads over tp=3 run replicated: q, k and v gathered; their gradients, the same on
      // every tp device, are sliced back to the heads' shards where they are.
      if (heads_replicated) want["all_gather over tp"] = 3;
      CHECK(counts_by_dim(comm) == want);
      // Bytes: each device's [b, h, L/n, .] blocks, f32 (the head-tail parts are half-blocks,
      // moved two at a time). Forward steps move k and v (2E columns), backward steps k, v and
      // their adjoints (4E), the last step the adjoints (2E). Swaps move half a block: q, k, v
      // (3E) in and out, lse (E + 1) out; q, k, v, out, lse, d_out, d_lse (5E + 2) in and dq, dk,
      // dv (3E) out. A device that is its own mirror (the middle one of an odd ring) moves
      // nothing there.
      const int64_t heads = heads_replicated || !layout.mesh.contains_dim("tp") ? 2 : 1;
      const int64_t batch = layout.mesh.contains_dim("dp") ? 1 : 2;
      const int64_t column = batch * heads * (length / n) * 4;  // bytes of one device's [.., L/n, 1] column
      const int64_t devices = layout.mesh.size(), swapping = n % 2 == 0 ? devices : devices / n * (n - 1);
      int64_t shift_bytes = 0;
      for (const CollectiveRecord& r : comm.records())
        if (r.kind == "shift") shift_bytes += r.bytes;
      const int64_t ring = devices * column * ((n - 1) * 2 * e + (n - 1) * 4 * e + 2 * e);
      const int64_t head_tail = causal ? swapping * column / 2 * (3 * e + (e + 1) + (5 * e + 2) + 3 * e) : 0;
      CHECK(shift_bytes == ring + head_tail);
    }
  }
}

namespace {

// A small Llama with a long sequence, so activations (which cp splits) outweigh the parameters
// and optimizer state (which every cp device holds whole).
TransformerConfig long_sequence_llama() {
  TransformerConfig c;
  c.name = "test-llama-long";
  c.vocab = 32, c.dim = 32, c.layers = 2, c.heads = 2, c.kv_heads = 2, c.hidden = 64, c.max_seq = 512, c.seed = 3;
  return c;
}

std::pair<Tensor, Tensor> token_batch(const Mesh& mesh, int64_t batch, int64_t length, int64_t vocab) {
  std::vector<int32_t> tokens(size_t(batch * length));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % size_t(vocab));
  const std::vector<Placement> placements = TransformerTrainingStep::batch_layout(mesh).placements();
  const Tensor ids = distribute_tensor(Array::from<int32_t>(tokens, {batch, length}), mesh, placements);
  std::rotate(tokens.begin(), tokens.begin() + 1, tokens.end());
  return {ids, distribute_tensor(Array::from<int32_t>(tokens, {batch, length}), mesh, placements)};
}

}  // namespace

TEST_CASE("a Transformer on a cp mesh trains by ring attention: one device's losses, memory falling as 1/cp, planned exactly") {
  const TransformerConfig c = long_sequence_llama();
  std::map<int64_t, int64_t> activations;
  std::vector<double> reference;
  for (int64_t n : {1, 2, 4}) {
    CAPTURE(n);
    const Mesh mesh = create_mesh({{"cp", n}});
    TransformerTrainingStep step(c, mesh);
    const auto [ids, targets] = token_batch(mesh, 1, c.max_seq, c.vocab);
    // The plan's peak and collective bytes are the measured ones, device by device.
    check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); });
    const PlanReport plan = step.plan(ids, targets);
    activations[n] = plan.peak_bytes - plan.input_bytes - plan.output_bytes;
    // Planned with no device touched (an abstract mesh of this machine's CPU devices, as
    // auto_parallelize plans): the same bytes.
    const PlanReport abstract = plan_transformer_training_step(c, abstract_mesh({{"cp", n}}, this_machine_device(n), 8), false,
                                                               false, 1);
    CHECK(abstract.peak_bytes == plan.peak_bytes);
    int64_t shifts = 0;
    {
      CommDebugMode comm;
      (void)step(ids, targets).full_tensor();
      for (const CollectiveRecord& r : comm.records()) shifts += r.kind == "shift";
    }
    // Per layer, as test "ring_attention's collectives" counts them: forward k and v, backward k, v
    // and their adjoints, in n-1 steps each, the adjoints home in 1, each of the two head-tail
    // parts, and 2 swaps each way.
    CHECK(shifts == (n == 1 ? 0 : c.layers * (2 * (5 * (n - 1) + 1) + 4)));
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(step(ids, targets).full_tensor().element_as_double(0));
    if (reference.empty()) reference = losses;
    for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(reference[i]).epsilon(2e-5));
  }
  // Activations and temporaries (the peak less the step's inputs and outputs: parameters, AdamW's
  // state and the batch, whole on every cp device) fall as 1/cp.
  for (int64_t n : {2, 4}) {
    CAPTURE(n);
    CAPTURE(activations[1]);
    CAPTURE(activations[n]);
    CHECK(double(activations[n]) <= double(activations[1]) / double(n) * 1.1);
  }
}

TEST_CASE("ring_attention in bf16 runs widened and rounds once; a length that does not split, an unknown dim or int operands are typed errors") {
  std::mt19937 rng(5);
  const Mesh mesh = create_mesh({{"cp", 2}});
  const Array q = random_f32({2, 24, 8}, rng), k = random_f32({2, 24, 8}, rng), v = random_f32({2, 24, 8}, rng);
  auto on = [&](const Array& a, DType dtype) { return cast(distribute_tensor(a, mesh, {Shard{1}}), dtype); };
  const Tensor out = ring_attention(on(q, DType::bf16), on(k, DType::bf16), on(v, DType::bf16), true, "cp");
  CHECK(out.dtype() == DType::bf16);
  const Tensor exact = ring_attention(on(q, DType::bf16), on(k, DType::bf16), on(v, DType::bf16), true, "cp");
  CHECK(max_difference(out.full_tensor(), exact.full_tensor()) == 0);
  const Tensor wide = scaled_dot_product_attention(cast(on(q, DType::bf16), DType::f32), cast(on(k, DType::bf16), DType::f32),
                                                   cast(on(v, DType::bf16), DType::f32), true);
  CHECK(max_difference(out.full_tensor(), cast(wide, DType::bf16).full_tensor()) <= 1.0 / 128);

  const Tensor tq = on(q, DType::f32), tk = on(k, DType::f32), tv = on(v, DType::f32);
  const Mesh four = create_mesh({{"cp", 4}});
  auto on4 = [&](const Array& a) { return distribute_tensor(a, four, {Shard{1}}); };
  // 24 rows make 8 chunks of 3 for the causal balance over 4 devices, but not 10 over 5.
  CHECK_NOTHROW(ring_attention(on4(q), on4(k), on4(v), true, "cp"));
  const Mesh five = create_mesh({{"cp", 5}});
  auto on5 = [&](const Array& a) { return distribute_tensor(a, five, {Shard{1}}); };
  CHECK_THROWS_WITH_AS(ring_attention(on5(q), on5(k), on5(v), true, "cp"),
                       doctest::Contains("must divide into 10 chunks (2 per device of mesh dim 'cp', for the causal load balance)"), ShapeError);
  CHECK_THROWS_WITH_AS(ring_attention(on5(q), on5(k), on5(v), false, "cp"),
                       doctest::Contains("must divide into 5 blocks (1 per device of mesh dim 'cp')"), ShapeError);
  CHECK_THROWS_WITH_AS(ring_attention(tq, tk, tv, true, "sp"), doctest::Contains("no dim 'sp'"), MeshError);
  CHECK_THROWS_AS(ring_attention(tq, tk, reshape(tv, {2, 12, 16}), true, "cp"), ShapeError);
  CHECK_THROWS_AS(ring_attention(cast(tq, DType::i32), cast(tk, DType::i32), cast(tv, DType::i32), true, "cp"), DTypeError);
}

TEST_CASE("auto_parallelize searches cp (ring attention) beside sp: a long sequence's activations split without gathering keys and values") {
  TransformerConfig c = long_sequence_llama();
  c.max_seq = 2048;
  const Hardware h100 = hardware_profile("h100-sxm");
  Transformer model(c, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 4, h100, int64_t(80) << 30, 1, 8, false);
  // One sequence on 4 devices: every plan splits its positions (or its heads, by tp).
  std::map<std::string, const ParallelCandidate*> by_name;
  for (const ParallelCandidate& candidate : search.candidates) by_name[candidate.name()] = &candidate;
  REQUIRE(by_name.count("cp=4"));
  REQUIRE(by_name.count("sp=4"));
  const ParallelCandidate &cp = *by_name["cp=4"], &sp = *by_name["sp=4"];
  // The ring never holds the whole sequence's keys and values; sp's attention gathers them.
  CHECK(cp.report.peak_bytes < sp.report.peak_bytes);
  // A cp candidate's plan is the training step's on that mesh.
  if (cp.exact) {
    const PlanReport again = plan_transformer_training_step(c, abstract_mesh(cp.mesh, h100, 8), false, false, 1);
    CHECK(again.peak_bytes == cp.report.peak_bytes);
  }
  // A length that does not split into 2 chunks per device is not a cp candidate.
  c.max_seq = 2044;  // 4 x 511: sp=4 splits it, cp=4 would need 8 chunks
  Transformer odd(c, abstract_mesh({{"dp", 1}}, h100, 8));
  for (const ParallelCandidate& candidate : auto_parallelize(odd, 4, h100, int64_t(80) << 30, 1, 8, false).candidates)
    for (const auto& [dim, size] : candidate.mesh) CHECK(!(dim == "cp" && size == 4));
}
