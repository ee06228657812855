#include "dsl/variable.hpp"

#include "dsl/autodiff.hpp"
#include "dsl/concrete_value.hpp"
#include "dsl/ops.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

thread_local VariableTrace* active_trace = nullptr;

// The traced value of a variable: its last assignment in this trace, else its input placeholder.
Tensor traced_value(VariableTrace& trace, const std::shared_ptr<Variable::State>& state) {
  for (size_t i = trace.assigned.size(); i-- > 0;)
    if (trace.assigned[i] == state) return trace.assigned_values[i];
  for (size_t i = 0; i < trace.read.size(); ++i)
    if (trace.read[i] == state) return trace.read_placeholders[i];
  // No value, as the arguments' placeholders (jit/jit_function.cpp's trace_graph).
  Tensor placeholder(make_traced_leaf(state->shape, state->dtype, state->layout, nullptr, state->value.node()->where));
  trace.read.push_back(state);
  trace.read_placeholders.push_back(placeholder);
  return placeholder;
}

}  // namespace

bool jit_tracing() { return active_trace != nullptr; }

VariableTraceScope::VariableTraceScope(VariableTrace& trace) : previous_(active_trace) { active_trace = &trace; }
VariableTraceScope::~VariableTraceScope() { active_trace = previous_; }

Variable::Variable(Tensor initial) : state_(std::make_shared<State>()) {
  require_concrete(initial.node(), "Variable(initial)");
  NodeValue v = force_or_abstract_value(initial.node());
  state_->value = Tensor(make_leaf(initial.shape(), initial.dtype(), v.layout, v.storage, initial.node()->where));  // the user's line
  state_->layout = v.layout;
  state_->shape = initial.shape();
  state_->dtype = initial.dtype();
}

Tensor Variable::value() const {
  if (active_trace) return traced_value(*active_trace, state_);
  return state_->value;
}

Layout Variable::layout() const { return state_->layout; }
Layout fetch_layout(const Variable& v) { return v.layout(); }
std::vector<int64_t> Variable::shape() const { return state_->shape; }
DType Variable::dtype() const { return state_->dtype; }

namespace {

// A value that may update a variable of `shape`, `dtype` and `layout` through `what` (assign,
// assign_add, assign_sub): the same shape (no broadcasting) and dtype, on the variable's mesh.
// A value in another layout of that mesh is redistributed into the variable's (PyTorch's add_
// of a Partial gradient into a sharded parameter does the same).
void check_assignable(std::string_view what, const Tensor& t, const std::vector<int64_t>& shape, DType dtype,
                      const Layout& layout) {
  const std::string op = "Variable::" + std::string(what);
  if (t.shape() != shape)
    throw ShapeError(op + ": the variable has shape " + shape_string(shape) + ", the value " + shape_string(t.shape()));
  if (t.dtype() != dtype)
    throw DTypeError(op + ": the variable holds " + std::string(dtype_name(dtype)) + ", the value " +
                     std::string(dtype_name(t.dtype())));
  const NodeRef& node = t.node();
  if (node->mesh.is_valid() && !(node->mesh == layout.mesh()))
    throw LayoutError(op + ": a variable's layout never changes; it is " + layout.specs_string() + " on " +
                      layout.mesh().to_string() + " but the value lives on " + node->mesh.to_string() +
                      " (move it with redistribute(mesh, placements) first)");
}

}  // namespace

void Variable::assign(const Tensor& t) {
  check_assignable("assign", t, state_->shape, state_->dtype, state_->layout);
  const NodeRef& node = t.node();
  if (active_trace) {
    active_trace->assigned.push_back(state_);
    active_trace->assigned_values.push_back(t);
    return;
  }
  // On an abstract mesh nothing runs: the variable holds an abstract value in its layout.
  NodeValue v = state_->layout.mesh().is_abstract() ? NodeValue{} : force_values({node}, {state_->layout}).front();
  state_->value = Tensor(make_leaf(state_->shape, state_->dtype, state_->layout, v.storage, state_->value.node()->where));
  state_->value_made_by_call = false;  // it may share t's storage
}

void Variable::assign_add(const Tensor& t) {
  check_assignable("assign_add", t, state_->shape, state_->dtype, state_->layout);
  assign(value() + t);
}

void Variable::assign_sub(const Tensor& t) {
  check_assignable("assign_sub", t, state_->shape, state_->dtype, state_->layout);
  assign(value() - t);
}

std::vector<Tensor> grad(const Tensor& loss, const std::vector<Variable>& wrt) {
  std::vector<Tensor> values;
  std::vector<std::optional<Layout>> layouts;
  for (const Variable& v : wrt) {
    values.push_back(v.value());
    layouts.push_back(v.layout());
  }
  return gradients(loss, values, layouts);
}

}  // namespace tessera
