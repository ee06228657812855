#include "program_fuzzer.hpp"

#include <array>
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

  // The program's output (its ops run as they are built only where the program reads a value).
  Tensor build() {
    const int ops = 5 + int(rng_() % 26);
    pool_.push_back(leaf(random_shape()));
    for (int i = 0; i < ops; ++i) {
      Tensor next;
      for (int attempt = 0; attempt < 8 && !next.is_valid(); ++attempt) next = random_op();
      if (next.is_valid()) pool_.push_back(next);
    }
    return pool_.back();
  }

  std::string build_and_check() {
    const Tensor out = build();
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

  // A value held as Partial terms (pack): term k on the devices at coordinate k of mesh dim d.
  Tensor partial_leaf(const std::vector<int64_t>& shape) {
    const int64_t d = pick(mesh_.ndim());
    const ReduceOp op = std::array{ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}[size_t(pick(3))];
    std::vector<Placement> placements(size_t(mesh_.ndim()), Replicate{});
    placements[size_t(d)] = Partial{op};
    std::uniform_real_distribution<float> value(-2, 2);
    std::vector<Array> terms;
    for (int64_t k = 0; k < mesh_.shape()[d]; ++k) {
      Array term(shape, DType::f32);
      for (int64_t i = 0; i < term.numel(); ++i) term.mutable_data<float>()[i] = value(rng_);
      terms.push_back(term);
    }
    Array global(shape, DType::f32);
    for (int64_t i = 0; i < global.numel(); ++i) {
      double acc = op == ReduceOp::Max ? -INFINITY : 0.0;
      for (const Array& term : terms) acc = op == ReduceOp::Max ? std::max(acc, double(term.data<float>()[i])) : acc + term.data<float>()[i];
      global.mutable_data<float>()[i] = float(op == ReduceOp::Avg ? acc / double(terms.size()) : acc);
    }
    std::vector<Array> components;
    for (const auto& coords : coords_of(mesh_)) components.push_back(terms[size_t(coords[size_t(d)])]);
    Tensor t = pack(components, Layout::from_placements(mesh_, placements, int64_t(shape.size())));
    leaves_[t.node().get()] = global;
    note(fmt::format("partial leaf {} {}({})", shape_string(shape), mesh_.dim_names()[size_t(d)], reduce_op_name(op)));
    return t;
  }

  std::vector<int64_t> common_shape() {
    static const std::vector<std::vector<int64_t>> shapes = {{2}, {3}, {4}, {2, 2}, {3, 2}};
    return shapes[size_t(pick(int64_t(shapes.size())))];
  }

  Tensor maybe_read(const Tensor& t) {
    if (pick(2)) {
      note("  read");
      (void)t.full_tensor();
    }
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
    switch (pick(22)) {
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
      // Partial values, often read at once: a read computes the value, and later programs take it
      // as an input. Their shapes come from a few, so that programs share reading programs (the
      // executable cache once gave a factory's reading program to every Partial input).
      case 19: return maybe_read(partial_leaf(pick(2) ? shape : common_shape()));
      case 20: {  // a factory made with Partial placements: its value is the fill, as every factory's
        const int64_t d = pick(mesh_.ndim());
        std::vector<Placement> placements(size_t(mesh_.ndim()), Replicate{});
        placements[size_t(d)] = Partial{};
        const double fill = double(pick(3));  // zeros, ones and twos
        const auto fill_shape = pick(2) ? shape : common_shape();
        note(fmt::format("full {} {} partial on {}", shape_string(fill_shape), fill, mesh_.dim_names()[size_t(d)]));
        return maybe_read(full(fill_shape, fill, mesh_, placements));
      }
      case 21: {  // a value read midway: later ops take it as a computed input
        note("read, then relu");
        (void)x.full_tensor();
        return relu(x);
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

std::string fuzz_program_digest(uint64_t seed) {
  try {
    const Array got = ProgramBuilder(seed).build().full_tensor();
    // FNV-1a over the dtype, the shape and the bytes: bit-exact, NaN payloads included.
    uint64_t h = 0xcbf29ce484222325ULL;
    auto add = [&](const void* data, size_t n) {
      for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 0x100000001b3ULL;
    };
    const int dtype = int(got.dtype());
    add(&dtype, sizeof dtype);
    for (int64_t e : got.shape()) add(&e, sizeof e);
    add(got.bytes(), size_t(got.nbytes()));
    return fmt::format("{:016x}", h);
  } catch (const std::exception& e) {
    std::string message = std::string("threw: ") + e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');  // one line per program
    return message;
  }
}

std::string fuzz_one_program(uint64_t seed) {
  try {
    return ProgramBuilder(seed).build_and_check();
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
}

}  // namespace tessera::testing
