// Variable (TF's DVariable): mutable state with a fixed layout. Copies are handles to the same
// state. assign / assign_add / assign_sub replace the value; a tensor in any other layout (or
// shape, or dtype) is refused with a typed error, as TF refuses to change a DVariable's layout.
//
// Eager: an assignment computes the new value at once (the graph never grows across steps).
// Inside jit: reading a variable gives the traced program an input bound to the variable's
// current value at every call; an assignment becomes a program output written back to the
// variable when the call returns (the old buffer goes back to the pool, so steps ping-pong
// between two buffers instead of copying).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "dsl/tensor.hpp"

namespace tessera {

class Variable {
 public:
  explicit Variable(Tensor initial);
  Tensor value() const;
  // A Variable reads as its value wherever a Tensor is taken (matmul(x, v), relu(v), v + a).
  operator Tensor() const { return value(); }
  Layout layout() const;
  std::vector<int64_t> shape() const;
  DType dtype() const;
  void assign(const Tensor& t);
  void assign_add(const Tensor& t);
  void assign_sub(const Tensor& t);

  struct State;
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};
using DVariable = Variable;

Layout fetch_layout(const Variable& v);  // TF's fetch_layout: the variable's (fixed) layout

// Gradients of `loss` with respect to each variable's value, each in its variable's layout.
std::vector<Tensor> grad(const Tensor& loss, const std::vector<Variable>& wrt);

// ---- jit tracing of variables (used by jit/) ----
struct Variable::State {
  Tensor value;  // always computed outside traces
  Layout layout;
  std::vector<int64_t> shape;
  DType dtype;
  // The value is a jit call's output, made for this variable alone (not a tensor the user gave):
  // a later call that assigns the variable may write its new value over it when nothing else
  // holds it (buffer donation, jit/jit_function.cpp).
  bool value_made_by_call = false;
};

// The record of a trace in progress on this thread: which variables it read (each read is an
// input of the traced program) and which it assigned (each assignment is an output).
struct VariableTrace {
  std::vector<std::shared_ptr<Variable::State>> read;
  std::vector<Tensor> read_placeholders;
  std::vector<std::shared_ptr<Variable::State>> assigned;
  std::vector<Tensor> assigned_values;
};

// Whether jit is tracing a function on this thread (a VariableTraceScope is alive).
bool jit_tracing();

// Makes `trace` the active record on this thread until the scope ends.
class VariableTraceScope {
 public:
  explicit VariableTraceScope(VariableTrace& trace);
  ~VariableTraceScope();
  VariableTraceScope(const VariableTraceScope&) = delete;
  VariableTraceScope& operator=(const VariableTraceScope&) = delete;

 private:
  VariableTrace* previous_;
};

}  // namespace tessera
