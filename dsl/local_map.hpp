// local_map (PyTorch's torch.distributed.tensor.experimental.local_map; JAX's shard_map): a
// function written for one device's block, applied to every device's block of global tensors.
//
//   auto mm_allreduce = local_map([](const Tensor& w, const Tensor& x) {
//     return all_reduce(matmul(w, x), ReduceOp::Sum, "x");   // each device: its partial product
//   }, {{Replicate{}}}, {{Shard{1}}, {Shard{0}}}, mesh);
//   Tensor y = mm_allreduce(w, x);                            // = matmul(w, x), Replicate
//
// fn is traced once into the same graph as everything around it: inside, a tensor argument is
// a LOCAL value (its shape is one device's block), and the functional collectives below move
// data between the devices of one mesh dim. Every device runs the same ops (SPMD). Blocks may
// be uneven: fn is traced with the first device's block, and each local value carries how its
// extents differ between devices (dsl/block_extents.hpp); ops whose devices would disagree
// are a ShapeError.
// Gradients flow through all of it. Autodiff tracks along which mesh dims each local value
// varies (JAX's rule): a value that is the same on every device of a dim and is used by values
// that differ there receives the all_reduce of their adjoints, so gradients are exact.
// A Replicate output must not vary along its dim (LayoutError: reduce or gather it first).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dsl/ops.hpp"
#include "dsl/variable.hpp"

namespace tessera {

// ---- functional collectives: on local values inside local_map, over one mesh dim ----
// Each is differentiable (adjoints: all_reduce <-> identity, all_gather <-> local chunk or
// reduce_scatter, all_to_all with the axes swapped, shift and permute by the inverse
// permutation, all_to_all_v with the counts transposed).
Tensor all_reduce(const Tensor& t, ReduceOp op, std::string_view mesh_dim, Loc where = Loc::current());
// Every device's block concatenated along `axis` in mesh-dim order.
Tensor all_gather(const Tensor& t, std::string_view mesh_dim, int64_t axis, Loc where = Loc::current());
// Reduced over the devices, then `axis` split: each device keeps its block (extent must divide).
Tensor reduce_scatter(const Tensor& t, ReduceOp op, std::string_view mesh_dim, int64_t axis, Loc where = Loc::current());
// `split_axis` cut into one block per device, block i sent to device i, the received blocks
// concatenated along `concat_axis` in mesh-dim order (the axes must differ).
Tensor all_to_all(const Tensor& t, std::string_view mesh_dim, int64_t split_axis, int64_t concat_axis,
                  Loc where = Loc::current());
// all_to_all with run-time split sizes (MPI_Alltoallv; torch's all_to_all_single with split
// sizes): send_counts (i64 [group size], computed on the devices) says how many consecutive rows
// of `rows` [R, ...] go to each device of the mesh dim, in order. Returns the received rows, the
// blocks from devices 0..n-1 concatenated, and recv_counts (i64 [n]: device j's send_counts[me]).
// The received tensor has the static extent max_received_rows (default R * n, the worst case);
// rows past the received total are zero. Counts that are negative, sum to more than R, or make a
// device receive more than the bound stop the step with an IndexError on every device.
std::pair<Tensor, Tensor> all_to_all_v(const Tensor& rows, const Tensor& send_counts, std::string mesh_dim,
                                       std::optional<int64_t> max_received_rows = std::nullopt, Loc where = Loc::current());
// Ring send/receive: device i's block goes to device (i + offset) mod n of the mesh dim.
Tensor shift(const Tensor& t, std::string_view mesh_dim, int64_t offset, Loc where = Loc::current());
// Static permutation (JAX's ppermute): device i's block goes to device destinations[i] of the
// mesh dim (destinations a permutation of 0..n-1; anything else is a LayoutError naming it).
// shift is the permutation i -> (i + offset) mod n, and both are one op: a permute is recorded
// (CommDebugMode, collective counts) as a "shift". The identity returns t unchanged.
Tensor permute(const Tensor& t, std::string_view mesh_dim, std::vector<int64_t> destinations, Loc where = Loc::current());
// This device's block of `axis` of a value that is the same on every device of the mesh dim
// (LayoutError otherwise); the adjoint of all_gather, with no communication.
Tensor local_chunk(const Tensor& t, std::string_view mesh_dim, int64_t axis, Loc where = Loc::current());
// This device's coordinate along the mesh dim of the enclosing local_map, an int32 scalar.
Tensor axis_index(std::string_view mesh_dim, Loc where = Loc::current());

// ---- local_map ----
// One output's placements, or std::nullopt for an output that is not a tensor (PyTorch's None):
// fn may return a tuple mixing tensors with other values (a count, a flag), passed back as is.
class OutputPlacements {
 public:
  OutputPlacements(std::initializer_list<Placement> placements) : placements_(std::vector<Placement>(placements)) {}
  OutputPlacements(std::vector<Placement> placements) : placements_(std::move(placements)) {}
  OutputPlacements(std::nullopt_t) {}
  bool is_tensor() const { return placements_.has_value(); }
  const std::vector<Placement>& placements() const { return *placements_; }  // only for a tensor output

 private:
  std::optional<std::vector<Placement>> placements_;
};

struct LocalMapSpec {
  std::vector<OutputPlacements> out_placements;        // one per output of fn
  std::vector<std::vector<Placement>> in_placements;   // one per tensor argument; empty: as it is
  Mesh mesh;                                           // empty: the tensor arguments' mesh
  bool redistribute_inputs = false;
  Loc where;
};

namespace detail {

// The destination table of a shift or permute node (OpKind::Shift): device i's block goes to
// device table[i] of its mesh dim.
std::vector<int64_t> shift_destinations(const NodeAttrs& attrs);

// While alive, axis_index() refers to `mesh` (local_map's fn runs inside one).
class LocalMapScope {
 public:
  explicit LocalMapScope(const Mesh& mesh);
  ~LocalMapScope();
  LocalMapScope(const LocalMapScope&) = delete;
  LocalMapScope& operator=(const LocalMapScope&) = delete;
};

// The mesh of the call: the given one, else the tensor arguments' (LayoutError when they differ).
Mesh local_map_mesh(const LocalMapSpec& spec, const std::vector<Tensor>& tensor_args);
// The graph nodes themselves (no checks): `global`'s block in `layout` as a local value, of
// `block_shape`; and local blocks as the global value of `layout`, of `shape`.
Tensor to_local_node(const Tensor& global, const Layout& layout, std::vector<int64_t> block_shape, Loc where);
Tensor from_local_node(const Tensor& local, const Layout& layout, std::vector<int64_t> shape, Loc where);

// Tensor argument `index` as a local value in its required placements (checked, or moved when
// spec.redistribute_inputs).
Tensor local_map_input(const Tensor& arg, size_t index, size_t count, const LocalMapSpec& spec, const Mesh& mesh);
// Output `index` of `count` as the global tensor its out_placements describe.
Tensor local_map_output(const Tensor& local, size_t index, size_t count, const LocalMapSpec& spec, const Mesh& mesh);
// Checks that output `index` of `count`, not a tensor, has std::nullopt for its placements.
void check_non_tensor_output(size_t index, size_t count, const LocalMapSpec& spec);

// One output of fn: a tensor made global, anything else passed back as it is.
template <class R>
auto wrap_output(R&& result, size_t index, size_t count, const LocalMapSpec& spec, const Mesh& mesh) {
  if constexpr (std::is_same_v<std::decay_t<R>, Tensor>) {
    return local_map_output(result, index, count, spec, mesh);
  } else {
    check_non_tensor_output(index, count, spec);
    return std::decay_t<R>(std::forward<R>(result));
  }
}

template <class A>
constexpr bool is_tensor_argument = std::is_same_v<std::decay_t<A>, Tensor> || std::is_same_v<std::decay_t<A>, Variable>;

// A std::tuple or std::pair (anything std::apply unpacks).
template <class T>
concept TupleLike = requires { std::tuple_size<T>::value; };

template <class R>
auto wrap_outputs(R&& result, const LocalMapSpec& spec, const Mesh& mesh) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    std::vector<Tensor> out;
    for (size_t i = 0; i < result.size(); ++i) out.push_back(local_map_output(result[i], i, result.size(), spec, mesh));
    return out;
  } else if constexpr (TupleLike<T>) {
    return [&]<size_t... I>(std::index_sequence<I...>) {
      return std::tuple{wrap_output(std::get<I>(result), I, sizeof...(I), spec, mesh)...};  // braces: left to right
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else {
    return wrap_output(std::forward<R>(result), 0, 1, spec, mesh);  // one tensor, or one other value
  }
}

}  // namespace detail

// Returns a callable: tensor (and Variable) arguments become local values as in_placements say,
// other arguments pass through unchanged, and fn's result (a Tensor, a vector of Tensors, or a
// tuple of Tensors and other values) comes back with its tensors global in out_placements and
// its other values as they are (std::nullopt placements). With no tensor argument, `mesh` says
// where fn runs (LayoutError without one).
template <class F>
auto local_map(F fn, std::vector<OutputPlacements> out_placements, std::vector<std::vector<Placement>> in_placements = {},
               Mesh mesh = {}, bool redistribute_inputs = false, Loc where = Loc::current()) {
  LocalMapSpec spec{std::move(out_placements), std::move(in_placements), std::move(mesh), redistribute_inputs, where};
  return [fn = std::move(fn), spec = std::move(spec)](auto&&... args) {
    std::vector<Tensor> tensors;
    [[maybe_unused]] auto collect = [&](const auto& a) {  // unused when fn takes no argument
      if constexpr (detail::is_tensor_argument<decltype(a)>) tensors.push_back(Tensor(a));
    };
    (collect(args), ...);
    const Mesh mesh = detail::local_map_mesh(spec, tensors);
    size_t next = 0;
    [[maybe_unused]] auto convert = [&](auto&& a) -> decltype(auto) {
      if constexpr (detail::is_tensor_argument<decltype(a)>) {
        const size_t i = next++;
        return detail::local_map_input(tensors[i], i, tensors.size(), spec, mesh);
      } else {
        return std::forward<decltype(a)>(a);
      }
    };
    // Braced initialisation converts the arguments left to right.
    std::tuple<std::conditional_t<detail::is_tensor_argument<decltype(args)>, Tensor, decltype(args)>...> local{
        convert(std::forward<decltype(args)>(args))...};
    detail::LocalMapScope scope(mesh);
    return detail::wrap_outputs(std::apply(fn, std::move(local)), spec, mesh);
  };
}

}  // namespace tessera
