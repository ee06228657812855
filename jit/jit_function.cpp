#include "jit/jit_function.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>

#include <functional>
#include <mutex>
#include <unordered_map>

#include "dsl/default_dtype.hpp"
#include "dsl/default_mesh.hpp"
#include "dsl/string_util.hpp"
#include "dsl/variable.hpp"
#include "jit/driver.hpp"
#include "jit/executable.hpp"
#include "jit/program_plan.hpp"

namespace tessera::detail {

struct TraceCache::Entry {
  std::shared_ptr<const Executable> executable;
  Executable::CollectiveOrigins collective_origins;  // this trace's lines and modules (CommDebugMode)
  // Per program input: an argument index (>= 0), a variable read (-2 - k), or captured (-1).
  std::vector<int> source_of_input;
  std::vector<NodeValue> inputs;  // captured values; other slots are filled per call
  // The captured values' nodes, kept alive with the entry: another trace that builds one of them
  // (hash-consing finds it) reads the same buffer rather than computing a copy, so that every
  // jit function of a step holds one copy of a constant, as its plan counts it
  // (plan/call_sequence_plan.hpp: inputs known by what holds them).
  std::vector<NodeRef> captured_nodes;
  std::vector<DType> output_dtypes;
  std::vector<std::vector<int64_t>> output_shapes;
  std::vector<std::shared_ptr<Variable::State>> variables_read;
  // Per program input: a variable whose buffer a run may write over, where nothing else holds
  // its value then (may_donate; held_by_variable_alone checks the holders at each call).
  std::vector<bool> may_donate;
  std::vector<std::shared_ptr<Variable::State>> variables_assigned;  // outputs after the user's
};

struct TraceCache::State {
  std::mutex mutex;
  std::unordered_map<std::string, Entry> entries;
};

std::shared_ptr<TraceCache::State> TraceCache::make_state() { return std::make_shared<State>(); }

namespace {

// The arguments' shapes, dtypes and layouts, and the state a trace reads besides them: the
// default dtype and the DefaultMeshScope's mesh decide what fn's factories make.
std::string signature(const std::vector<Tensor>& args) {
  std::string key = std::string(dtype_name(default_dtype())) + ';';
  if (const std::optional<Mesh> mesh = default_mesh()) key += mesh->to_string();
  key += ';';
  for (const Tensor& t : args) {
    key += shape_string(t.shape());
    key += dtype_name(t.dtype());
    key += t.layout().to_string();
    key += ';';
  }
  return key;
}

// Parts of the traced graph that do not depend on any argument (weights drawn with
// random_normal, values built from captured tensors) are computed once, now, and captured as
// values, so calls do not redo them. Pure constants stay in the graph: they fold into kernels.
void compute_invariants(const std::vector<Tensor>& outputs, const std::vector<Tensor>& placeholders) {
  std::unordered_map<const Node*, bool> depends, constant;
  std::vector<NodeRef> invariant_roots;
  for (const Tensor& p : placeholders) depends[p.node().get()] = true;
  // Once a node's inputs are settled: whether it depends on a placeholder, whether it is a
  // constant, and which of its inputs are invariant roots.
  auto settle = [&](const NodeRef& n) {
    // Constants: fills and iotas without a layout of their own, and ops on them only.
    bool dep = false, is_constant = (n->op == OpKind::Full || n->op == OpKind::Iota) && !n->attrs.layout;
    if (!n->value())
      for (const auto& in : n->inputs) {
        dep |= depends[in.get()];
        is_constant = (is_constant || is_elementwise(n->op) || is_movement(n->op)) && constant[in.get()];
      }
    if (n->value()) is_constant = false;
    depends[n.get()] = dep;
    constant[n.get()] = is_constant && !dep;
    if (dep)
      for (const auto& in : n->inputs)
        // A local value (a device's block inside local_map, such as axis_index's coordinate)
        // exists only while the program runs: it stays in the graph.
        if (!depends[in.get()] && !constant[in.get()] && !in->value() && in->mesh.is_valid() && !in->local)
          invariant_roots.push_back(in);
  };
  // Depth first, inputs before the node, with a stack of its own: a chain of dependent ops is
  // as long as the user makes it, and recursion overflowed the thread's stack.
  std::vector<std::pair<NodeRef, size_t>> pending;  // a node and its next input to visit
  for (const Tensor& o : outputs) {
    pending.push_back({o.node(), 0});
    while (!pending.empty()) {
      auto& [n, next] = pending.back();
      if (depends.count(n.get())) {
        pending.pop_back();
      } else if (!n->value() && next < n->inputs.size()) {
        const NodeRef in = n->inputs[next++];
        pending.push_back({in, 0});
      } else {
        settle(n);
        pending.pop_back();
      }
    }
  }
  std::vector<NodeRef> computed;
  for (const NodeRef& root : invariant_roots) {
    if (root->mesh.is_abstract()) (void)force_or_abstract_value(root);  // held as an abstract input
    else computed.push_back(root);
  }
  if (!computed.empty()) force_values(computed);
}

// A trace of fn on the arguments' signature: the graph's outputs (the user's, then each
// assigned variable's last value in the variable's layout) and what its inputs stand for.
struct TracedGraph {
  std::vector<Tensor> placeholders;
  VariableTrace variables;
  std::vector<NodeRef> nodes;
  std::vector<std::optional<Layout>> layouts;
  std::vector<DType> output_dtypes;
  std::vector<std::vector<int64_t>> output_shapes;
  std::vector<std::shared_ptr<Variable::State>> variables_assigned;
};

TracedGraph trace_graph(const std::vector<Tensor>& args, const TraceCache::Trace& trace) {
  TracedGraph t;
  // Fresh leaves in the arguments' layouts, so each argument is its own input. They hold no
  // value: nothing reads a traced value (dsl/concrete_value.hpp), and a traced graph kept after
  // its trace (a module's statistics of the last traced loss) must not keep this call's values
  // alive, nor stop a later call writing over them (held_by_variable_alone).
  for (const Tensor& a : args) {
    NodeValue v = force_or_abstract_value(a.node());
    t.placeholders.push_back(Tensor(make_traced_leaf(a.shape(), a.dtype(), v.layout, nullptr, a.node()->where)));
  }
  std::vector<Tensor> outputs;
  {
    VariableTraceScope scope(t.variables);
    outputs = trace(t.placeholders);
  }
  std::vector<Tensor> varying = t.placeholders;
  varying.insert(varying.end(), t.variables.read_placeholders.begin(), t.variables.read_placeholders.end());
  compute_invariants(outputs, varying);
  for (const Tensor& o : outputs) {
    t.nodes.push_back(o.node());
    t.layouts.push_back(std::nullopt);
    t.output_dtypes.push_back(o.dtype());
    t.output_shapes.push_back(o.shape());
  }
  // Each assigned variable's last value is an output, in the variable's layout.
  const VariableTrace& variables = t.variables;
  for (size_t i = 0; i < variables.assigned.size(); ++i) {
    bool last = true;
    for (size_t k = i + 1; k < variables.assigned.size(); ++k) last &= variables.assigned[k] != variables.assigned[i];
    if (!last) continue;
    t.variables_assigned.push_back(variables.assigned[i]);
    t.nodes.push_back(variables.assigned_values[i].node());
    t.layouts.push_back(variables.assigned[i]->layout);
  }
  return t;
}

// Per program input (`read_by`: the variable it reads, or null), whether a run may write its
// new values over it: the call assigns that variable (its old value is dropped after it), no
// other input reads it (one buffer, one input), and its new value is no other output's (two
// variables assigned one value share it after the call).
std::vector<bool> may_donate(const std::vector<const Variable::State*>& read_by,
                             const std::vector<std::shared_ptr<Variable::State>>& assigned, const std::vector<int>& outputs,
                             size_t user_outputs) {
  std::vector<bool> out(read_by.size(), false);
  for (size_t k = 0; k < read_by.size(); ++k) {
    if (!read_by[k] || std::count(read_by.begin(), read_by.end(), read_by[k]) != 1) continue;
    for (size_t v = 0; v < assigned.size(); ++v)
      if (assigned[v].get() == read_by[k]) out[k] = std::count(outputs.begin(), outputs.end(), outputs[user_outputs + v]) == 1;
  }
  return out;
}

// Whether nothing but the variable can read its value now: a jit call made it for this
// variable, and no tensor, pending op, captured value or array shares its node, storage or
// buffers (a user's `Tensor before = v.value()`, a lazily built `v.value() * 2`, a to_local()
// of it all do, and then it is left as it is).
bool held_by_variable_alone(const Variable::State& state) {
  if (!state.value_made_by_call || state.value.node().use_count() != 1) return false;
  const std::optional<NodeValue> value = state.value.node()->value();
  if (!value || !value->storage || value->storage.use_count() != 2) return false;  // the node's, and `value` here
  for (const Array& component : value->storage->components)
    if (!component.owns_buffer_alone()) return false;
  return true;
}

}  // namespace

const TraceCache::Entry& TraceCache::entry(const std::vector<Tensor>& args, const Trace& trace) {
  const std::string key = signature(args);
  {
    std::lock_guard lock(state_->mutex);
    if (auto it = state_->entries.find(key); it != state_->entries.end()) return it->second;
  }
  TracedGraph traced = trace_graph(args, trace);
  const std::vector<Tensor>& placeholders = traced.placeholders;
  const VariableTrace& variables = traced.variables;
  const std::vector<NodeRef>& nodes = traced.nodes;
  const std::vector<std::optional<Layout>>& layouts = traced.layouts;
  Entry e;
  e.output_dtypes = traced.output_dtypes;
  e.output_shapes = traced.output_shapes;
  e.variables_assigned = traced.variables_assigned;
  e.variables_read = variables.read;
  // Inputs are bound through this trace's own nodes: the executable may come from the cache,
  // built for another function of the same structure (two identical models, say).
  const BoundExecutable bound = bind_executable(nodes, layouts);
  e.executable = bound.executable;
  e.collective_origins = bound.collective_origins;
  for (const NodeRef& in : bound.inputs) {
    int source = -1;
    for (size_t i = 0; i < placeholders.size(); ++i)
      if (placeholders[i].node() == in) source = int(i);
    for (size_t k = 0; k < variables.read_placeholders.size(); ++k)
      if (variables.read_placeholders[k].node() == in) source = -2 - int(k);
    e.source_of_input.push_back(source);
    // Only captured values are kept: an argument's or a variable's value of this call must not
    // stay alive (and on its devices) as long as the function does.
    e.inputs.push_back(source == -1 ? *in->value() : NodeValue{});
    if (source == -1) e.captured_nodes.push_back(in);
  }
  std::vector<const Variable::State*> read_by;
  for (int source : e.source_of_input) read_by.push_back(source <= -2 ? e.variables_read[size_t(-2 - source)].get() : nullptr);
  e.may_donate = may_donate(read_by, e.variables_assigned, e.executable->program().outputs, e.output_dtypes.size());
  std::lock_guard lock(state_->mutex);
  return state_->entries.emplace(key, std::move(e)).first->second;
}

std::vector<Tensor> TraceCache::call(const std::vector<Tensor>& args, const Trace& trace) {
  // A jit function called while another is traced becomes part of that trace (as jax.jit
  // inlines): running it now would bake its result, and its variable updates, into the outer one.
  if (jit_tracing()) return trace(args);
  const Entry& e = entry(args, trace);
  std::vector<NodeValue> inputs = e.inputs;
  // Before any value is copied here (a copy is another holder).
  std::vector<bool> donated(inputs.size(), false);
  for (size_t k = 0; k < inputs.size(); ++k)
    donated[k] = e.may_donate[k] && held_by_variable_alone(*e.variables_read[size_t(-2 - e.source_of_input[k])]);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const int source = e.source_of_input[k];
    if (source >= 0) inputs[k] = force_value(args[source].node());
    else if (source <= -2) inputs[k] = force_value(e.variables_read[-2 - source]->value.node());
  }
  std::vector<NodeValue> results = e.executable->run(inputs, e.collective_origins, name_, donated);
  std::vector<Tensor> out;
  const size_t user_outputs = e.output_dtypes.size();
  for (size_t i = 0; i < user_outputs; ++i) {
    out.push_back(Tensor(make_leaf(e.output_shapes[i], e.output_dtypes[i], results[i].layout, results[i].storage)));
    remember_producer(out.back().node(), e.executable);
  }
  for (size_t v = 0; v < e.variables_assigned.size(); ++v) {
    auto& state = *e.variables_assigned[v];
    state.value = Tensor(make_leaf(state.shape, state.dtype, state.layout, results[user_outputs + v].storage, state.value.node()->where));
    state.value_made_by_call = true;
  }
  return out;
}

std::shared_ptr<const Executable> TraceCache::executable(const std::vector<Tensor>& args, const Trace& trace) {
  return entry(args, trace).executable;
}

ProgramPlan TraceCache::program_plan(const std::vector<Tensor>& args, const Trace& trace) {
  if (jit_tracing())
    throw Error("plan(args...) of a jit function inside another jit function's trace: plan the outer function instead");
  const TracedGraph traced = trace_graph(args, trace);
  ProgramPlan plan = plan_program(traced.nodes, traced.layouts);
  // The variables the call may write over are donated, as a call whose variables' old values
  // nothing else holds donates them (held_by_variable_alone).
  const VariableTrace& variables = traced.variables;
  std::vector<const Variable::State*> read_by(plan.program.inputs.size(), nullptr);  // the variable each input reads
  for (size_t k = 0; k < plan.program.inputs.size(); ++k)
    for (size_t j = 0; j < variables.read_placeholders.size(); ++j)
      if (plan.program.inputs[k] == variables.read_placeholders[j].node()) read_by[k] = variables.read[j].get();
  plan.donated_inputs = may_donate(read_by, traced.variables_assigned, plan.program.outputs, traced.output_dtypes.size());
  for (size_t k = 0; k < plan.program.inputs.size(); ++k) {
    const void* identity = read_by[k] ? static_cast<const void*>(read_by[k]) : plan.program.inputs[k].get();
    for (size_t i = 0; i < traced.placeholders.size(); ++i)
      if (plan.program.inputs[k] == traced.placeholders[i].node()) identity = args[i].node().get();
    plan.input_identities.push_back(identity);
  }
  return plan;
}

int64_t TraceCache::traces() const {
  std::lock_guard lock(state_->mutex);
  return int64_t(state_->entries.size());
}

std::string readable_type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  std::string full = status == 0 && demangled ? demangled.get() : type.name();
  for (size_t at; (at = full.find("(anonymous namespace)::")) != std::string::npos;) full.erase(at, 23);
  // Parameter lists and template arguments say nothing a reader needs here:
  // "tessera::GptTrainingStep::GptTrainingStep(tessera::GptConfig const&, ...)::{lambda(...)#1}"
  // reads "tessera::GptTrainingStep::GptTrainingStep::{lambda#1}".
  std::string name;
  int depth = 0;
  for (char c : full) {
    if (c == '(' || c == '<') ++depth;
    if (depth == 0) name += c;
    if ((c == ')' || c == '>') && depth > 0) --depth;
  }
  return name;
}

}  // namespace tessera::detail
