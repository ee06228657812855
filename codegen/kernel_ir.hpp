// The loop-level kernel IR: what one fused kernel does on one device's blocks. Small on purpose
// (Halide's Stmt/Expr, tinygrad's UOps): loops, loads, stores, mutable scalars for reductions,
// and scalar ALU expressions. Renderers turn it into LLVM IR (CPU) or CUDA C
// (cuda_renderer.hpp); fusion never sees a target, lowering only to choose loop structures
// (codegen/lower_kernel.hpp).
//
// Kernel ABI: void kernel(void** buffers, const int64_t* params, int64_t begin, int64_t end).
// buffers[i] is the i-th buffer; params are the device's run-time extents and offsets; the
// outermost loop runs over [begin, end) so a kernel can be split across threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsl/dtype.hpp"
#include "dsl/special_function.hpp"

namespace tessera::kir {

// Scalar types of values inside kernels. bf16/f16 exist only in memory: they load as f32.
enum class Type { I1, I32, I64, U8, F32, F64, BF16, F16 };
Type type_of(DType dtype);
Type compute_type(Type storage);  // bf16/f16 -> f32
bool is_float(Type t);
std::string_view type_name(Type t);

// The expression ops, defined once: X(Enum, "name", operands). The enum, op_name, op_arity and
// kir::verify's operand count come from this list.
#define TESSERA_KIR_OPS(X)                                                                             \
  /* leaves (Load: buffer `id`, args[0] = element index) */                                          \
  X(IntConst, "int", 0) X(FloatConst, "float", 0) X(Var, "var", 0) X(Param, "param", 0) X(Load, "load", 1) \
  /* unary (Exp/Log/Tanh/Cos/Sin: f64 only; f32 uses math_functions.hpp); Floor: float */                \
  X(Neg, "neg", 1) X(Abs, "abs", 1) X(Exp, "exp", 1) X(Log, "log", 1) X(Sqrt, "sqrt", 1) X(Tanh, "tanh", 1) \
  X(Cos, "cos", 1) X(Sin, "sin", 1) X(Floor, "floor", 1)                                                                \
  /* args[0] reinterpreted as `type` (same width: f32<->i32, f64<->i64) */                          \
  X(Bitcast, "bitcast", 1)                                                                             \
  /* integer bit operations */                                                                       \
  X(Shl, "shl", 2) X(AShr, "ashr", 2) X(BitAnd, "bitand", 2) X(BitOr, "bitor", 2)                    \
  X(BitXor, "bitxor", 2)                                                                               \
  /* binary (Div/Rem on integers truncate; float Max/Min propagate NaN) */                           \
  X(Add, "add", 2) X(Sub, "sub", 2) X(Mul, "mul", 2) X(Div, "div", 2) X(Rem, "rem", 2) X(Max, "max", 2) \
  X(Min, "min", 2) X(Pow, "pow", 2)                                                                    \
  /* I32 operands taken as unsigned: their whole 64-bit product, an I64 */                          \
  X(MulWide, "mulwide", 2)                                                                             \
  /* predicates (I1) */                                                                              \
  X(Eq, "eq", 2) X(Ne, "ne", 2) X(Lt, "lt", 2) X(Le, "le", 2) X(And, "and", 2) X(Or, "or", 2)        \
  /* args: condition, if true, if false */                                                           \
  X(Select, "select", 3)                                                                               \
  /* args[0] converted to `type` */                                                                  \
  X(Cast, "cast", 1)

enum class Op {
#define TESSERA_KIR_OP_ENUM(name, text, operands) name,
  TESSERA_KIR_OPS(TESSERA_KIR_OP_ENUM)
#undef TESSERA_KIR_OP_ENUM
};
std::string_view op_name(Op op);  // as kernels print: "add"
int op_arity(Op op);              // operands it takes

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;
struct ExprNode {
  Op op;
  Type type;
  int64_t iconst = 0;
  double fconst = 0;
  int id = 0;  // Var: variable, Param: slot, Load: buffer
  std::vector<Expr> args;
  // Releases the arguments it last owned from a loop, not by recursion: a kernel fusing a chain
  // of 100,000 ops is an expression that deep (dsl/release_iteratively.hpp).
  ~ExprNode();
};

Expr int_const(int64_t v, Type t = Type::I64);
Expr float_const(double v, Type t);
Expr var(int id, Type t = Type::I64);
Expr param(int slot);  // an I64 run-time parameter
Expr load(int buffer, Type storage, Expr index);
Expr unary(Op op, Expr a);
Expr binary(Op op, Expr a, Expr b);  // predicates give I1, MulWide I64
Expr select(Expr c, Expr a, Expr b);
Expr cast(Expr a, Type t);
Expr bitcast(Expr a, Type t);

// How a loop runs. Lowering makes one loop of each kernel its RANGE loop, the one run over the
// ABI's [begin, end): Parallel when its iterations are independent, Ordered when they must run
// in order, and for CUDA GpuWarp when each iteration is a warp's (its Lanes loop split over the
// lanes) or GpuBlock when it is a whole block's; every other loop is Serial. for_target() maps the range loop to what a target runs it
// as, and the renderers map each kind one to one.
enum class LoopKind {
  Serial,     // an ordinary loop
  Parallel,   // range loop, iterations independent: on CPUs each thread takes a sub-range
  Ordered,    // range loop, iterations in order: one thread runs it whole
  GpuThread,  // range loop on a GPU: a grid-stride loop over every thread of the launch
  GpuWarp,    // range loop on a GPU: each warp of the launch takes an iteration, its lanes together
  GpuBlock,   // range loop on a GPU: each block of the launch takes an iteration, its threads
              // together (few outputs, each a reduction over many elements)
  Lanes,      // inner loop of a GpuWarp (GpuBlock) loop: the warp's lanes (the block's threads)
              // split its iterations, each adding into `reduce_var`; after it every lane holds
              // the `reduce_op` of all the lanes' values (a butterfly, then the warps' results
              // in warp order: bitwise the same in every lane). Serial where not a GPU.
};
std::string_view loop_kind_name(LoopKind kind);
// A range loop only a GPU runs (GpuThread, GpuWarp, GpuBlock).
bool is_gpu_range(LoopKind kind);

// The loop structures a kernel is lowered to: CPU ranges, or GPU threads and warps (a
// backend names its own: jit/backend_registry.hpp).
enum class LoopTarget { Cpu, Cuda };

struct Stmt;
using StmtPtr = std::shared_ptr<Stmt>;
struct Stmt {
  enum class Kind { Block, For, Store, Declare, Assign } kind;
  std::vector<StmtPtr> body;  // Block and For
  int var = 0;                // For: loop variable; Declare/Assign: scalar variable
  Type type = Type::I64;      // Declare: the variable's type
  Expr a, b;                  // For: begin, end; Store: index, value; Declare/Assign: value
                              // (a value stored to bf16/f16 is one that type holds: lowering
                              // rounds it, storage_rounding.hpp; renderers only narrow it)
  int buffer = 0;             // Store
  LoopKind loop = LoopKind::Serial;  // For: how it runs (at most one range loop per kernel)
  int reduce_var = -1;               // Lanes: the variable its lanes combine afterwards,
  Op reduce_op = Op::Add;            // with Add, Mul, Max or Min;
  bool lanes_in_order = false;       // in lane order, as one thread adding the iterations in
                                     // order would (each lane takes at most one: the CPU's bits)
  // For, Serial: a loop over an output's axis inside the range loop, whose iterations write
  // disjoint elements and read none another writes (an output written over its input reads it
  // at the element it writes: codegen/in_place.hpp), as a Parallel loop's do. The CPU renderer
  // declares such loops parallel to LLVM, which then vectorizes them without run-time checks.
  bool independent = false;
  bool is_range_loop() const { return kind == Kind::For && loop != LoopKind::Serial && loop != LoopKind::Lanes; }
};

StmtPtr block(std::vector<StmtPtr> body = {});
StmtPtr for_loop(int var, Expr begin, Expr end, std::vector<StmtPtr> body, LoopKind loop = LoopKind::Serial);
StmtPtr store(int buffer, Expr index, Expr value);
StmtPtr declare(int var, Type type, Expr init);
StmtPtr assign(int var, Expr value);

struct Buffer {
  Type type;  // storage type
  bool output = false;
  // An output a run may write over one of the kernel's inputs, or that input (buffer donation,
  // jit/memory_plan.hpp): the renderers give it no noalias / __restrict__, which would promise
  // the compiler that no other buffer is the same memory.
  bool may_alias = false;
};

struct Kernel {
  std::string name;
  std::vector<Buffer> buffers;
  StmtPtr body;
  int num_vars = 0;
  Expr outer_extent;        // trip count of the range loop (the ABI's `end` for a whole run)
  bool ordered_reductions = false;  // no reassociation or FMA contraction: reductions in source order (deterministic mode)
  std::vector<std::string> fused_ops;  // the ops fused into it, for explain()
  // What it computes, for the time model (codegen/step_costs.hpp): every op evaluated (each value
  // at each index once, as lowering shares them), of those each special function (exp, log,
  // tanh, pow) and the ones whose result is rounded to a 16-bit float
  // (codegen/storage_rounding.hpp). Ops inside a reduction's loops run once per element it
  // reads; the rest once per element of the output. (Counted all per element read, a layer
  // norm's backward, most of whose ops follow its row sums, was planned at 7x its time.)
  struct OpCounts {
    int64_t ops = 0, rounded_to_bf16 = 0, rounded_to_f16 = 0;
    std::array<int64_t, kSpecialFunctions.size()> special{};  // by SpecialFunction
  };
  OpCounts per_output_element, per_reduced_element;
  // A check_index kernel's last buffer: the device's status word, two int64 {program node + 1,
  // the index} of the first index out of range (dsl/index_check.hpp); -1: none.
  int status_buffer = -1;

  std::string to_string() const;  // canonical text: the compile cache key and TESSERA_DUMP
  LoopKind range_loop() const;     // the kind of its range loop
};

// The kernel as `target` runs it: its range loop mapped (Parallel -> GpuThread on CUDA; on a
// CPU GpuThread, GpuWarp and GpuBlock -> Parallel and Lanes -> Serial).
Kernel for_target(Kernel kernel, LoopTarget target);
// for_target without kir::verify, for lowering: the schedule verifies each distinct kernel once
// (codegen/schedule.cpp), not every duplicate a repeated block lowers again.
Kernel retargeted(Kernel kernel, LoopTarget target);

// Structural equality (same ops, types, constants and leaves).
bool equal(const Expr& a, const Expr& b);

// Value of an integer expression over constants and parameters (extents, trip counts).
int64_t evaluate(const Expr& e, const int64_t* params);

}  // namespace tessera::kir
