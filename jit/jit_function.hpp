// jit(fn): the equivalent of tf.function / jax.jit. The first call with a given input signature
// (shapes, dtypes, layouts) traces fn: it runs fn on the arguments, which only builds the global
// graph, and compiles that graph. Every later call with the same signature binds the new
// arguments to the compiled program and runs it: no graph building, no per-op host work.
// fn takes Tensors and returns a Tensor, a std::tuple of Tensors or a std::vector<Tensor>.
// Tensors fn uses without taking them as arguments are captured with their values at trace time.
// Inside fn, a tensor built from the arguments has no value yet: reading it (full_tensor,
// to_local, unpack, printing) is a ConcretizationError (dsl/concrete_value.hpp). A jit function
// called inside fn is inlined into fn's trace.
#pragma once

#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "dsl/hardware.hpp"
#include "dsl/tensor.hpp"

namespace tessera {

class Executable;
struct ProgramPlan;
// The planner's report (plan/plan_report.hpp). JitFunction::plan is declared here and defined
// in plan/jit_function_plan.cpp, so the runtime names the report without depending on the planner.
struct PlanReport;

namespace detail {

class TraceCache {
 public:
  // name: the function or module whose jit this is (TESSERA_PROFILE names its programs so).
  explicit TraceCache(std::string name = {}) : name_(std::move(name)) {}
  using Trace = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  std::vector<Tensor> call(const std::vector<Tensor>& args, const Trace& trace);
  std::string explain(const std::vector<Tensor>& args, const Trace& trace);  // jit/api/explain.cpp
  int64_t traces() const;
  std::shared_ptr<const Executable> executable(const std::vector<Tensor>& args, const Trace& trace);
  // The program a call with these arguments would run, partitioned, scheduled and memory
  // planned as the driver does it, never compiled or run (traces afresh).
  ProgramPlan program_plan(const std::vector<Tensor>& args, const Trace& trace);
  // Its report (defined in plan/jit_function_plan.cpp). hardware: the profile to predict with;
  // none: the mesh's own (abstract meshes carry theirs; a real CPU mesh's is this machine's
  // calibration, measured once: plan/hardware_profiles.hpp).
  PlanReport plan(const std::vector<Tensor>& args, const Trace& trace, const std::optional<Hardware>& hardware = std::nullopt);

  struct Entry;

 private:
  const Entry& entry(const std::vector<Tensor>& args, const Trace& trace);
  std::string name_;
  struct State;
  std::shared_ptr<State> state_ = make_state();
  static std::shared_ptr<State> make_state();
};

// A type's name as a reader would write it: demangled, without parameter lists or template
// arguments ("main::{lambda#1}", "tessera::GptTrainingStep::GptTrainingStep::{lambda#1}").
std::string readable_type_name(const std::type_info& type);

// The function a jit wraps: a std::function's target, anything else's own type.
template <class F>
std::string function_name(const F& fn) {
  if constexpr (requires { fn.target_type(); }) return readable_type_name(fn.target_type());
  else return readable_type_name(typeid(F));
}

template <class T> struct is_tuple : std::false_type {};
template <class... T> struct is_tuple<std::tuple<T...>> : std::true_type {};

template <class R>
std::vector<Tensor> flatten(const R& r) {
  if constexpr (std::is_same_v<R, Tensor>) return {r};
  else if constexpr (std::is_same_v<R, std::vector<Tensor>>) return r;
  else {
    static_assert(is_tuple<R>::value, "a jit function returns a Tensor, a std::tuple of Tensors or a std::vector<Tensor>");
    return std::apply([](const auto&... t) { return std::vector<Tensor>{t...}; }, r);
  }
}

template <class R>
R unflatten(const std::vector<Tensor>& v) {
  if constexpr (std::is_same_v<R, Tensor>) return v[0];
  else if constexpr (std::is_same_v<R, std::vector<Tensor>>) return v;
  else return [&]<size_t... I>(std::index_sequence<I...>) { return R{v[I]...}; }(std::make_index_sequence<std::tuple_size_v<R>>());
}

template <class F, class... Args>
auto call_with(const F& fn, const std::vector<Tensor>& args) {
  return [&]<size_t... I>(std::index_sequence<I...>) { return fn((void(sizeof(Args)), args[I])...); }(
      std::index_sequence_for<Args...>());
}

}  // namespace detail

template <class F>
class JitFunction {
 public:
  explicit JitFunction(F fn) : fn_(std::move(fn)), cache_(std::make_shared<detail::TraceCache>(detail::function_name(fn_))) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    using R = std::decay_t<decltype(fn_(args...))>;
    std::vector<Tensor> outs = cache_->call({Tensor(args)...}, tracer<Args...>());
    return detail::unflatten<R>(outs);
  }

  // The per-device plan of a call with these arguments (traces if needed).
  template <class... Args>
  std::string explain(const Args&... args) const {
    return cache_->explain({Tensor(args)...}, tracer<Args...>());
  }

  // What a call with these arguments would cost, without running it or compiling its kernels
  // (plan/plan_report.hpp): on a real mesh or an abstract one (abstract_mesh), whose arguments
  // are tensors with layouts and no values. Traces afresh on every call.
  // (auto: PlanReport is complete where plan/plan_report.hpp is included, as tessera.hpp does.)
  template <class... Args>
  auto plan(const Args&... args) const {
    return cache_->plan({Tensor(args)...}, tracer<Args...>());
  }
  // The same, predicted with `hardware` (hardware_profile("h100-sxm"), a profile read from JSON,
  // a stored calibration): nothing is measured, so planning a small function takes milliseconds.
  template <class... Args>
  auto plan(const Hardware& hardware, const Args&... args) const {
    return cache_->plan({Tensor(args)...}, tracer<Args...>(), hardware);
  }

  // The partitioned, scheduled and memory-planned program a call with these arguments would run
  // (jit/program_plan.hpp; traces afresh, compiles nothing). A step made of several jit calls
  // plans them together from these (plan/call_sequence_plan.hpp).
  template <class... Args>
  auto program_plan(const Args&... args) const {
    return cache_->program_plan({Tensor(args)...}, tracer<Args...>());
  }

  int64_t traces() const { return cache_->traces(); }  // how many signatures were traced

  // The compiled program a call with these arguments runs (traces if needed).
  template <class... Args>
  std::shared_ptr<const Executable> executable(const Args&... args) const {
    return cache_->executable({Tensor(args)...}, tracer<Args...>());
  }

 private:
  template <class... Args>
  detail::TraceCache::Trace tracer() const {
    return [this](const std::vector<Tensor>& traced) {
      return detail::flatten(detail::call_with<F, Args...>(fn_, traced));
    };
  }
  F fn_;
  std::shared_ptr<detail::TraceCache> cache_;
};

template <class F>
auto jit(F fn) {
  return JitFunction<F>(std::move(fn));
}

}  // namespace tessera
