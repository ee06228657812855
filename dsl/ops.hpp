// The public ops (API.md). Each builds nodes of the global graph and runs nothing. Shapes and
// dtypes are inferred here, with numpy broadcasting; a scalar operand adopts the tensor's dtype.
// Errors (ShapeError, DTypeError, LayoutError) name the op, the shapes and the user's file:line.
// Composites (softmax, mean, one_hot, ...) lower into the primitive ops of op_kind.hpp.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <vector>

#include "dsl/default_dtype.hpp"
#include "dsl/source_location.hpp"
#include "dsl/tensor.hpp"

namespace tessera {

using Loc = SourceLocation;

// An operand of the arithmetic operators: a Tensor, a Variable (its current value) or a scalar.
// Converting to it records where the user wrote the expression (operators cannot take a
// defaulted SourceLocation themselves).
class Variable;

struct Operand {
  Operand(const Tensor& t, Loc where = Loc::current()) : tensor(t), where(where) {}
  Operand(const Variable& v, Loc where = Loc::current());
  template <class T>
    requires std::is_arithmetic_v<T>
  Operand(T value, Loc where = Loc::current()) : scalar(double(value)), integral(std::is_integral_v<T>), where(where) {}
  std::optional<Tensor> tensor;
  double scalar = 0;
  bool integral = false;  // a scalar given as an integer: where(c, 1, 2) is int64, as in PyTorch
  Loc where;
};

// ---- elementwise ----
Tensor add(const Operand& a, const Operand& b);
Tensor sub(const Operand& a, const Operand& b);
Tensor mul(const Operand& a, const Operand& b);
Tensor div(const Operand& a, const Operand& b);
Tensor maximum(const Operand& a, const Operand& b);
Tensor minimum(const Operand& a, const Operand& b);
Tensor pow(const Operand& a, const Operand& b);
Tensor operator+(const Operand& a, const Operand& b);
Tensor operator-(const Operand& a, const Operand& b);
Tensor operator*(const Operand& a, const Operand& b);
Tensor operator/(const Operand& a, const Operand& b);
Tensor operator-(const Operand& a);
// Comparisons give bool (u8) tensors.
Tensor operator==(const Operand& a, const Operand& b);
Tensor operator!=(const Operand& a, const Operand& b);
Tensor operator<(const Operand& a, const Operand& b);
Tensor operator<=(const Operand& a, const Operand& b);
Tensor operator>(const Operand& a, const Operand& b);
Tensor operator>=(const Operand& a, const Operand& b);
Tensor where(const Tensor& condition, const Operand& a, const Operand& b, Loc where = Loc::current());
// x itself, through which no gradient flows (TensorFlow's stop_gradient, PyTorch's detach).
Tensor stop_gradient(const Tensor& x, Loc where = Loc::current());
Tensor cast(const Tensor& x, DType dtype, Loc where = Loc::current());

Tensor neg(const Tensor& x, Loc where = Loc::current());
Tensor abs(const Tensor& x, Loc where = Loc::current());
Tensor exp(const Tensor& x, Loc where = Loc::current());
Tensor log(const Tensor& x, Loc where = Loc::current());
Tensor sqrt(const Tensor& x, Loc where = Loc::current());
Tensor rsqrt(const Tensor& x, Loc where = Loc::current());
Tensor square(const Tensor& x, Loc where = Loc::current());
Tensor tanh(const Tensor& x, Loc where = Loc::current());
// Radians; floating tensors only (DTypeError). f32 kernels use one polynomial on every device, so
// a rotary table computed on the devices is the same under every layout.
Tensor sin(const Tensor& x, Loc where = Loc::current());
Tensor cos(const Tensor& x, Loc where = Loc::current());
Tensor sigmoid(const Tensor& x, Loc where = Loc::current());
Tensor relu(const Tensor& x, Loc where = Loc::current());

// ---- reductions (axes may be negative; empty axes = all) ----
// Bool and integer sums are i64 (numpy's and PyTorch's rule); cumsum follows it.
Tensor reduce_sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false, Loc where = Loc::current());
DType sum_dtype(DType dtype);  // the dtype reduce_sum and cumsum of `dtype` values return
Tensor reduce_mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false, Loc where = Loc::current());
Tensor reduce_max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false, Loc where = Loc::current());
Tensor reduce_min(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false, Loc where = Loc::current());
Tensor reduce_prod(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdims = false, Loc where = Loc::current());
Tensor argmax(const Tensor& x, int64_t axis, Loc where = Loc::current());  // int64

// ---- composites ----
Tensor softmax(const Tensor& logits, int64_t axis = -1, Loc where = Loc::current());
Tensor log_softmax(const Tensor& logits, int64_t axis = -1, Loc where = Loc::current());
// labels [..] integer class ids, logits [.., classes] -> per-example loss [..]
Tensor sparse_softmax_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits, Loc where = Loc::current());
// PyTorch's F.cross_entropy with class indices and mean reduction, classes on the LAST axis:
// the mean over labels' elements of -log_softmax(logits)[label]. Logits sharded over the
// classes stay sharded (loss parallel): only per-row maxima and sums are all_reduced.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Loc where = Loc::current());
Tensor one_hot(const Tensor& indices, int64_t depth, DType dtype = DType::f32, Loc where = Loc::current());

// ---- linear algebra ----
Tensor matmul(const Tensor& a, const Tensor& b, Loc where = Loc::current());  // 2-D or batched

// ---- movement ----
Tensor reshape(const Tensor& x, std::vector<int64_t> shape, Loc where = Loc::current());  // one -1 allowed
Tensor transpose(const Tensor& x, std::vector<int64_t> perm = {}, Loc where = Loc::current());  // default: reverse
Tensor broadcast_to(const Tensor& x, std::vector<int64_t> shape, Loc where = Loc::current());
namespace detail {
// `x` with no Partial placement left: pending partial terms are reduced here, all of x in one
// collective (normalisation statistics stacked into one tensor travel together).
Tensor reduce_partials(const Tensor& x, Loc where = Loc::current());
// LayoutError when operands live on different meshes, or mix local_map's local values with
// global tensors.
void check_meshes(std::string_view op, const std::vector<NodeRef>& inputs, Loc where);
// broadcast_to(x, like's shape), with like's block extents inside local_map (autodiff's
// adjoints of reductions).
Tensor broadcast_like(const Tensor& x, const NodeRef& like, Loc where);
// x with its last two axes swapped (a batched matrix transposed).
Tensor transpose_last_two(const Tensor& x, Loc where);
// a [..., k] and b [..., n] with the same leading axes -> [k, n], a^T b summed over all of those
// rows: a Rows product's right-operand gradient (dsl/dot_form.hpp).
Tensor contract_rows(const Tensor& a, const Tensor& b, Loc where);
}  // namespace detail
Tensor expand_dims(const Tensor& x, int64_t axis, Loc where = Loc::current());
Tensor squeeze(const Tensor& x, std::vector<int64_t> axes = {}, Loc where = Loc::current());
// tf.slice: `size` -1 means to the end of the axis.
Tensor slice(const Tensor& x, std::vector<int64_t> begin, std::vector<int64_t> size, Loc where = Loc::current());
Tensor pad(const Tensor& x, std::vector<std::pair<int64_t, int64_t>> paddings, double value = 0, Loc where = Loc::current());
Tensor concat(const std::vector<Tensor>& xs, int64_t axis, Loc where = Loc::current());

// ---- layout constraint and sources ----
// A lazy, differentiable relayout: the value in `layout` where it is looked at (relayout and
// Tensor::redistribute build this node). `grad_layout`, when given, is where the gradient of the
// result is wanted (PyTorch's grad_placements); without it the partitioner places the gradient.
Tensor with_layout(const Tensor& x, Layout layout, Loc where = Loc::current());
Tensor with_layout(const Tensor& x, Layout layout, std::optional<Layout> grad_layout, Loc where = Loc::current());
// The same, the gradient cast to `grad_dtype` before it is relaid out: a Partial gradient is then
// reduced in that dtype (mixed precision's reduce_dtype). A floating dtype only (DTypeError).
Tensor with_layout(const Tensor& x, Layout layout, std::optional<Layout> grad_layout, std::optional<DType> grad_dtype,
                   Loc where = Loc::current());
Tensor iota(std::vector<int64_t> shape, int64_t axis, Layout layout, DType dtype = DType::i32, Loc where = Loc::current());
// The same values as a node of its own for each `tag` (hash-consing gives equal expressions one
// node): what keeps a pipeline's per-tick masks apart (nn/pipeline.hpp) while they compile to one
// kernel.
Tensor tagged_iota(std::vector<int64_t> shape, int64_t axis, Layout layout, int64_t tag, DType dtype = DType::i32,
                   Loc where = Loc::current());
// Stateless, counter-based (Philox-4x32-10) on the global element index: the same seed gives the
// same global tensor under every layout and device count.
Tensor random_uniform(std::vector<int64_t> shape, uint64_t seed, Layout layout, double minval = 0, double maxval = 1,
                      DType dtype = default_dtype(), Loc where = Loc::current());
Tensor random_normal(std::vector<int64_t> shape, uint64_t seed, Layout layout, double mean = 0, double stddev = 1,
                     DType dtype = default_dtype(), Loc where = Loc::current());

// Factories: the layout decides what each device materialises; values never depend on it.
Tensor zeros(std::vector<int64_t> shape, Layout layout, DType dtype = default_dtype(), Loc where = Loc::current());
Tensor ones(std::vector<int64_t> shape, Layout layout, DType dtype = default_dtype(), Loc where = Loc::current());
Tensor full(std::vector<int64_t> shape, double value, Layout layout, DType dtype = default_dtype(), Loc where = Loc::current());
Tensor empty(std::vector<int64_t> shape, Layout layout, DType dtype = default_dtype(), Loc where = Loc::current());
// full() as a node of its own for each `tag`, as tagged_iota: values that must not share one
// buffer (several variables reset to zeros in one call, each then updated in place) stay apart.
Tensor tagged_full(std::vector<int64_t> shape, double value, Layout layout, int64_t tag, DType dtype = default_dtype(),
                   Loc where = Loc::current());

}  // namespace tessera
