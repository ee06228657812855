#include "program_fuzzer.hpp"

#include <cmath>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"
#include "dsl/string_util.hpp"

namespace tessera::testing {
namespace {

constexpr int64_t kMaxElements = 2048;

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t e : s) n *= e;
  return n;
}

class ProgramBuilder {
 public:
  explicit ProgramBuilder(uint64_t seed) : rng_(uint32_t(seed * 2654435761u)) {
    auto meshes = test_meshes();
    mesh_ = meshes[rng_() % meshes.size()];
  }

  std::string build_and_check() {
    const int ops = 5 + int(rng_() % 26);
    pool_.push_back(leaf(random_shape()));
    for (int i = 0; i < ops; ++i) {
      Tensor next;
      for (int attempt = 0; attempt < 8 && !next.is_valid(); ++attempt) next = random_op();
      if (next.is_valid()) pool_.push_back(next);
    }
    const Tensor& out = pool_.back();
    Array got = out.full_tensor();
    RefArray want = reference_eval(out, leaves_);
    double scale = 1;
    for (double v : want.data)
      if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
    for (int64_t i = 0; i < got.numel(); ++i) {
      double g = got.element_as_double(i), w = want.data[i];
      bool ok = is_floating(want.dtype) ? (std::isnan(w) ? std::isnan(g) : std::fabs(g - w) <= 2e-3 * scale || g == w) : g == w;
      if (!ok) return fmt::format("mesh {}\nprogram:\n{}element {}: got {} want {}", mesh_.to_string(), log_, i, g, w);
    }
    if (got.shape() != want.shape) return "shape mismatch\n" + log_;
    return "";
  }

 private:
  int64_t pick(int64_t n) { return int64_t(rng_() % uint64_t(n)); }

  std::vector<int64_t> random_shape() {
    std::vector<int64_t> shape(1 + pick(3));
    for (auto& e : shape) e = pick(6) == 0 ? pick(2) : 1 + pick(7);  // sizes 0 and 1 sometimes
    return shape;
  }

  Tensor leaf(const std::vector<int64_t>& shape) {
    Array a(shape, DType::f32);
    std::uniform_real_distribution<float> value(-2, 2);
    for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = value(rng_);
    Layout l = random_layout(mesh_, int64_t(shape.size()), rng_);
    Tensor t = copy_to_mesh(a, l);
    leaves_[t.node().get()] = a;
    note("leaf " + shape_string(shape) + " [" + fmt::format("{}", fmt::join(l.sharding_specs(), ",")) + "]");
    return t;
  }

  void note(const std::string& s) { log_ += "  %" + std::to_string(pool_.size()) + " = " + s + "\n"; }

  Tensor any() { return pool_[pick(int64_t(pool_.size()))]; }

  // A partner of x's shape: another value of that shape if one exists, else a new leaf.
  Tensor partner(const Tensor& x) {
    std::vector<Tensor> same;
    for (const Tensor& t : pool_)
      if (t.shape() == x.shape()) same.push_back(t);
    if (!same.empty() && pick(3)) return same[pick(int64_t(same.size()))];
    return leaf(x.shape());
  }

  Tensor random_op() {
    Tensor x = any();
    const auto shape = x.shape();
    const int64_t r = x.rank();
    switch (pick(19)) {
      case 0: note("relu"); return relu(x);
      case 1: note("tanh"); return tanh(x);
      case 2: note("exp(tanh)"); return exp(tanh(x));
      case 3: note("log(abs+1)"); return log(abs(x) + 1.0);
      case 4: { Tensor y = partner(x); note("add"); return x + y; }
      case 5: { Tensor y = partner(x); note("mul"); return x * y; }
      case 6: { Tensor y = partner(x); note("max"); return maximum(x, y); }
      case 7: { Tensor y = partner(x); note("div"); return x / (abs(y) + 1.0); }
      case 8: note("scalar"); return x * 0.5 - 1.25;
      case 9: {
        if (r == 0) return {};
        int64_t axis = pick(r);
        bool keep = pick(2);
        int kind = int(pick(3));
        note(fmt::format("reduce {} axis {} keep {}", kind, axis, keep));
        return kind == 0 ? reduce_sum(x, {axis}, keep) : kind == 1 ? reduce_max(x, {axis}, keep) : reduce_mean(x, {axis}, keep);
      }
      case 10: {
        if (r == 0) return {};
        int64_t axis = pick(r);
        note("softmax axis " + std::to_string(axis));
        return softmax(x, axis);
      }
      case 11: {
        if (r < 2) return {};
        std::vector<int64_t> perm(r);
        for (int64_t a = 0; a < r; ++a) perm[a] = a;
        std::shuffle(perm.begin(), perm.end(), rng_);
        note("transpose");
        return transpose(x, perm);
      }
      case 12: {
        if (r < 2) return {};
        std::vector<int64_t> s(shape.begin(), shape.end() - 2);
        s.push_back(shape[r - 2] * shape[r - 1]);
        note("reshape " + shape_string(s));
        return reshape(x, s);
      }
      case 13: {
        std::vector<int64_t> target = shape;
        target.insert(target.begin(), 1 + pick(3));
        if (numel(target) > kMaxElements) return {};
        note("broadcast_to " + shape_string(target));
        return broadcast_to(x, target);
      }
      case 14: {
        if (r == 0) return {};
        std::vector<int64_t> begin(r), size(r);
        for (int64_t a = 0; a < r; ++a) {
          begin[a] = shape[a] ? pick(shape[a]) : 0;
          size[a] = shape[a] - begin[a] ? pick(shape[a] - begin[a] + 1) : 0;
        }
        note("slice");
        return slice(x, begin, size);
      }
      case 15: {
        if (r == 0 || numel(shape) * 3 > kMaxElements) return {};
        int64_t axis = pick(r);
        note("concat axis " + std::to_string(axis));
        return concat({x, x * 2.0}, axis);
      }
      case 16: {  // 2-D, or rows along every leading axis (dsl/dot_form.hpp)
        if (r < 2) return {};
        Tensor w = leaf({shape.back(), 1 + pick(5)});
        note("matmul");
        return matmul(x, w);
      }
      case 17: {  // the weight's gradient: x's rows contracted, Partial over their shards
        if (r < 2) return {};
        Tensor w = leaf({shape.back(), 1 + pick(5)});
        std::vector<int64_t> out_shape = shape;
        out_shape.back() = w.shape()[1];
        Tensor y = leaf(out_shape);
        note("matmul weight gradient");
        return gradients(reduce_sum(matmul(x, w) * y), {w})[0];
      }
      default: {
        Layout l = random_layout(mesh_, r, rng_);
        note("with_layout [" + fmt::format("{}", fmt::join(l.sharding_specs(), ",")) + "]");
        return with_layout(where(x > 0.0, x, x * 0.1), l);
      }
    }
  }

  std::mt19937 rng_;
  Mesh mesh_;
  std::vector<Tensor> pool_;
  std::map<const Node*, Array> leaves_;
  std::string log_;
};

}  // namespace

std::string fuzz_one_program(uint64_t seed) {
  try {
    return ProgramBuilder(seed).build_and_check();
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
}

}  // namespace tessera::testing
