// The primitive ops of the global graph (tinygrad-sized). Every public op lowers into these.
// One X-macro generates the enum, the names and the categories (Halide's src/Expr.h does the same).
#pragma once

#include <string_view>

namespace tessera {

enum class OpCategory { Source, Unary, Binary, Compare, Ternary, Cast, Reduce, Movement, Indexing, Dot, Attention, Constraint, Local, Collective };

// The collectives, listed once: local_map's functional collectives (OpKind, below) and the steps
// of a redistribute (RedistributeKind, ir/redistribute_step.hpp) both take their entries from
// here. X(Enum, "name", ...), the trailing arguments passed through. As ops, attrs.axes = {mesh
// dim, axis, second axis}:
//   all_reduce      attrs.scalar = ReduceOp
//   all_gather      concatenated along axes[1] in mesh order
//   reduce_scatter  reduced, then axes[1] split over the mesh dim
//   all_to_all      axes[1] split and sent, received blocks concatenated along axes[2]
//   shift           axes[1..] = destinations: device i's block to device axes[1 + i] (shift()
//                   and permute(): a rotation or any permutation)
//   local_chunk     this device's block of axes[1] (all_gather's adjoint; moves no data)
//   all_to_all_v    inputs (rows, counts [n, n] i64 alike on every device: row i = device i's
//                   run-time send counts); rows, in order, to the devices; axes[1] = rows out
#define TESSERA_COLLECTIVES(X, ...)                                                             \
  X(AllReduce, "all_reduce", __VA_ARGS__) X(AllGather, "all_gather", __VA_ARGS__)              \
  X(ReduceScatter, "reduce_scatter", __VA_ARGS__) X(AllToAll, "all_to_all", __VA_ARGS__)       \
  X(Shift, "shift", __VA_ARGS__) X(LocalChunk, "local_chunk", __VA_ARGS__)                   \
  X(AllToAllV, "all_to_all_v", __VA_ARGS__)

// X(Enum, "name", Category)
#define TESSERA_OP_KINDS(X)                                                                          \
  X(Leaf, "leaf", Source)                 /* a materialised value (pack, copy_to_mesh, a forced op) */ \
  X(Full, "full", Source)                 /* every element = attrs.scalar */                         \
  X(Iota, "iota", Source)                 /* global index along attrs.axes[0] */                    \
  X(RandomUniform, "random_uniform", Source) /* Philox on the global element index */               \
  X(RandomNormal, "random_normal", Source)                                                          \
  X(Neg, "neg", Unary)                                                                              \
  X(Abs, "abs", Unary)                                                                              \
  X(Exp, "exp", Unary)                                                                              \
  X(Log, "log", Unary)                                                                              \
  X(Sqrt, "sqrt", Unary)                                                                            \
  X(Tanh, "tanh", Unary)                                                                            \
  X(Sin, "sin", Unary)                                                                              \
  X(Cos, "cos", Unary)                                                                              \
  X(Add, "add", Binary)                                                                             \
  X(Sub, "sub", Binary)                                                                             \
  X(Mul, "mul", Binary)                                                                             \
  X(Div, "div", Binary)                                                                             \
  X(Maximum, "maximum", Binary)                                                                     \
  X(Minimum, "minimum", Binary)                                                                     \
  X(Pow, "pow", Binary)                                                                             \
  X(Equal, "equal", Compare)                                                                        \
  X(NotEqual, "not_equal", Compare)                                                                 \
  X(Less, "less", Compare)                                                                          \
  X(LessEqual, "less_equal", Compare)                                                               \
  X(Where, "where", Ternary)                                                                        \
  X(Cast, "cast", Cast)                                                                             \
  /* identity on integer indices; one outside [attrs.scalar, attrs.scalar2) stops the step with an IndexError (dsl/index_check.hpp) */ \
  X(CheckIndex, "check_index", Cast)                                                                \
  X(StopGradient, "stop_gradient", Cast)  /* identity whose gradient is zero (TF's stop_gradient, torch's detach) */ \
  /* identity whose value is never Partial: the terms of several values stacked in one tensor are reduced here, by one collective */ \
  X(ReducePartials, "reduce_partials", Cast)                                                        \
  X(ReduceSum, "reduce_sum", Reduce)      /* over attrs.axes; the reduced axes are dropped */      \
  X(ReduceProd, "reduce_prod", Reduce)                                                              \
  X(ReduceMax, "reduce_max", Reduce)                                                                \
  X(ReduceMin, "reduce_min", Reduce)                                                                \
  X(ArgMax, "argmax", Reduce)             /* over attrs.axes[0]; int64 index of the first max */  \
  X(Reshape, "reshape", Movement)                                                                   \
  X(Permute, "permute", Movement)         /* attrs.axes = perm */                                   \
  X(Expand, "expand", Movement)           /* broadcast size-1 axes to the node's shape */          \
  X(Slice, "slice", Movement)             /* attrs.starts / attrs.steps, shape = extents */        \
  X(Pad, "pad", Movement)                 /* attrs.starts = low pads, attrs.scalar = fill */        \
  X(Concat, "concat", Movement)           /* along attrs.axes[0] */                                 \
  /* data-dependent rows: table [V, D], ids [N] (int32/int64); an id outside [0, V) picks zeros */ \
  X(TakeRows, "take_rows", Indexing)      /* (table, ids [...]) -> [..., D]: out[n] = table[ids[n]] */ \
  X(ScatterAddRows, "scatter_add_rows", Indexing) /* (g [..., D], ids [...]) -> [attrs.axes[0], D]: out[ids[n]] += g[n], n in order */ \
  X(Dot, "dot", Dot)                      /* batched matmul [..., m, k] x [..., k, n] */          \
  /* dropless mixture of experts (dsl/grouped_matmul.hpp): consecutive row groups, group e's rows [ends[e-1], ends[e]) */ \
  X(GroupedDot, "grouped_dot", Dot)       /* (x [N, K], w [E, K, F], ends i64 [E]) -> [N, F]: group e's rows times w[e]; rows past ends[E-1] are zero */ \
  X(GroupedWeightGrad, "grouped_weight_grad", Dot) /* (x [N, K], dy [N, F], ends i64 [E]) -> [E, K, F]: x_e^T dy_e */ \
  X(Attention, "attention", Attention)    /* fused attention, one part of it: dsl/attention_parts.hpp */ \
  X(WithLayout, "with_layout", Constraint) /* identity whose layout is attrs.layout */             \
  X(LayoutHint, "layout_hint", Constraint) /* identity: attrs.layout only when handed to the user */   \
  X(MeshTransfer, "mesh_transfer", Constraint) /* identity onto attrs.layout's (another) mesh */      \
  /* local_map (dsl/local_map.hpp): inside fn, values are each device's own block */                   \
  X(ToLocal, "to_local", Local)           /* a global value's block in attrs.layout, as a local value */ \
  X(FromLocal, "from_local", Local)       /* local blocks as the global value of attrs.layout */        \
  /* functional collectives on local values (TESSERA_COLLECTIVES above) */                            \
  TESSERA_COLLECTIVES(X, Collective)

enum class OpKind {
#define TESSERA_OP_ENUM(name, text, category) name,
  TESSERA_OP_KINDS(TESSERA_OP_ENUM)
#undef TESSERA_OP_ENUM
};

std::string_view op_name(OpKind op);
OpCategory op_category(OpKind op);
bool is_elementwise(OpKind op);  // unary, binary, compare, ternary, cast
bool is_reduce(OpKind op);
enum class ReduceOp;  // dsl/placement.hpp
// The combine of a reduce op (ReduceSum: Sum, ReduceMax: Max, ...); InternalError for any other op.
ReduceOp reduce_op_of(OpKind op);
bool is_movement(OpKind op);
bool is_functional_collective(OpKind op);  // all_reduce ... local_chunk, on local values
// exp, log, div, pow, tanh, reduce, dot, attention: never recomputed per consumer by fusion.
bool is_expensive(OpKind op);

}  // namespace tessera
