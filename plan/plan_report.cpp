#include "plan/plan_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "dsl/element_count.hpp"
#include "dsl/logging.hpp"
#include "plan/cache_residency.hpp"
#include "jit/device.hpp"
#include "plan/hardware_profiles.hpp"
#include "jit/program_plan.hpp"
#include "jit/redistribute_executor.hpp"
#include "codegen/step_costs.hpp"

namespace tessera {
namespace {

// Latency terms of a collective over a group of k: gathers, scatters and all_to_all pass
// blocks round a ring (k-1 hops), a shift takes one; an all_reduce takes the cheaper of a ring
// (reduce_scatter then all_gather, 2(k-1) hops) and a tree (2 ceil(log2 k) hops), as NCCL picks
// a tree for small messages between nodes. The bytes term is the bytes received either way.
int64_t collective_hops(RedistributeKind kind, int64_t k) {
  int64_t log2k = 0;
  while ((int64_t(1) << log2k) < k) ++log2k;
  switch (kind) {
    case RedistributeKind::AllReduce: return std::min(2 * (k - 1), 2 * log2k);
    case RedistributeKind::AllGather:
    case RedistributeKind::ReduceScatter:
    case RedistributeKind::AllToAll:
    case RedistributeKind::AllToAllV: return k - 1;
    case RedistributeKind::Shift: return 1;
    default: return 0;
  }
}

double rate_or_f32(double rate, double f32) { return rate > 0 ? rate : f32; }

// One device's pass over the steps: memory held over time and the modelled time of each step.
struct DeviceCosts {
  int64_t peak = 0, inputs = 0, outputs = 0, collective_bytes = 0;
  double flops = 0, seconds = 0;
  std::vector<double> step_seconds, step_flops;
  std::vector<int64_t> step_bytes;  // touched (kernels, library calls) or received (collectives)
};

class DeviceWalk {
 public:
  DeviceWalk(const ProgramPlan& plan, const Hardware& hw, const std::vector<int64_t>& params, std::vector<int64_t> coords)
      : plan_(plan), p_(plan.program), hw_(hw), params_(params), coords_(std::move(coords)), cache_(hw.cache_bytes),
        shared_cache_(hw.shared_cache_bytes) {}

  // The buffers outside the arena held during step `s`, largest first.
  std::string held_buffers(const std::vector<int64_t>& bytes, const std::vector<int64_t>& references, size_t s) const {
    std::vector<int> live;
    for (size_t b = 0; b < bytes.size(); ++b)
      if (references[b] > 0 && bytes[b] > 0) live.push_back(int(b));
    std::sort(live.begin(), live.end(), [&](int a, int b) { return bytes[size_t(a)] > bytes[size_t(b)]; });
    std::string out = fmt::format("device peak at step {}: buffers outside the arena, largest first", s);
    for (size_t i = 0; i < live.size() && i < 16; ++i) {
      const LocalNode& n = p_.nodes[size_t(live[i])];
      out += fmt::format("\n  %{} {} {}: {} {}", live[i], n.kind == LocalNode::Kind::Redistribute ? redistribute_kind_name(n.step.kind) : op_name(n.op),
                         bytes_text(double(bytes[size_t(live[i])])), n.origin.module ? *n.origin.module : std::string(), n.origin.location);
    }
    return out;
  }

  DeviceCosts run() {
    DeviceCosts c;
    const size_t count = p_.nodes.size();
    // Where each value lives, as the executor places it (jit/device_run.cpp).
    enum class Home { Input, Arena, Own };
    std::vector<Home> home(count, Home::Own);
    for (size_t n = 0; n < count; ++n)
      if (p_.nodes[n].kind == LocalNode::Kind::Input) {
        home[n] = Home::Input;
        c.inputs += local_bytes(p_.nodes[n], params_);
      }
    // Outputs written over donated inputs take no memory of their own (jit/memory_plan.hpp).
    const std::vector<int> donor = assign_donors(p_, plan_.memory, plan_.donated_inputs);
    bool checks_indices = false;
    for (const kir::Kernel& k : plan_.schedule.kernels) checks_indices |= k.status_buffer >= 0;
    // The arena, and the status word of programs that check indices, are held through a run.
    int64_t held = c.inputs + plan_.memory.arena_bytes + (checks_indices ? 2 * int64_t(sizeof(int64_t)) : 0);
    c.peak = held;
    const bool in_place_gathers = p_.mesh.device_kind() == DeviceKind::CPU;  // DeviceRun::gathers_in_place
    // Buffers outside the arena, as the executor holds them: each value that owns or shares one
    // refers to it, and it is freed when the last of them is dropped (MemoryPlan::release_after).
    std::vector<int> buffer_of(count, -1);  // the node whose buffer a value lives in
    // TESSERA_LOG=memory: what the buffers outside the arena are at the peak.
    const bool log_peak = component_logger("memory").should_log(spdlog::level::debug);
    std::string peak_buffers;
    std::vector<int64_t> buffer_bytes(count, 0), references(count, 0);
    auto refer = [&](int value, int buffer) {
      buffer_of[size_t(value)] = buffer;
      if (buffer >= 0) ++references[size_t(buffer)];
    };
    auto new_buffer = [&](int value, int64_t bytes) {
      held += bytes;
      buffer_bytes[size_t(value)] = bytes;
      refer(value, value);
    };
    for (size_t s = 0; s < plan_.schedule.steps.size(); ++s) {
      const ScheduledStep& step = plan_.schedule.steps[s];
      const LocalNode& n = p_.nodes[size_t(step.node)];
      int64_t staging = 0, copied = 0;  // a redistribute's staging, and its result's own bytes
      if (step.kind != ScheduledStep::Kind::Redistribute) {
        for (int o : step.outputs) {
          const int gather = plan_.memory.in_gather[size_t(o)];
          if (gather >= 0 && in_place_gathers) {  // the gather's output, referred to by both
            new_buffer(gather, local_bytes(p_.nodes[size_t(gather)], params_));
            refer(o, gather);
          } else if (plan_.memory.offset[size_t(o)] >= 0) {
            home[size_t(o)] = Home::Arena;
          } else if (donor[size_t(o)] >= 0) {
            home[size_t(o)] = Home::Input;
          } else {
            new_buffer(o, local_bytes(p_.nodes[size_t(o)], params_));
          }
        }
      } else if (step.outputs.size() > 1) {  // a bucket: one joined buffer
        int64_t joined = 0;
        for (int o : step.outputs) joined += local_bytes(p_.nodes[size_t(o)], params_);
        new_buffer(step.outputs.front(), joined);
        for (size_t i = 1; i < step.outputs.size(); ++i) refer(step.outputs[i], step.outputs.front());
      } else if (plan_.memory.offset[size_t(step.node)] >= 0) {  // an all_to_all_v into the arena (memory_plan.cpp)
        home[size_t(step.node)] = Home::Arena;
        copied = local_bytes(n, params_);
      } else {
        const bool preallocated = in_place_gathers && plan_.memory.in_gather[size_t(n.inputs[0])] == step.node;
        const StepAllocation a = redistribute_step_allocation(n.step, n.global_shape, n.dtype, coords_, preallocated);
        if (a.result == 0 && !preallocated) {  // a view of its input
          home[size_t(step.node)] = home[size_t(n.inputs[0])];
          refer(step.node, buffer_of[size_t(n.inputs[0])]);
        } else if (a.result > 0) {
          new_buffer(step.node, a.result);
        }
        staging = a.staging;
        copied = a.result;
      }
      if (held + staging > c.peak && log_peak) peak_buffers = held_buffers(buffer_bytes, references, s);
      c.peak = std::max(c.peak, held + staging);
      account_time(step, copied, c);
      for (int value : plan_.memory.release_after[s]) {
        const int buffer = buffer_of[size_t(value)];
        if (buffer >= 0 && --references[size_t(buffer)] == 0) held -= buffer_bytes[size_t(buffer)];
      }
    }
    if (log_peak && !peak_buffers.empty()) component_logger("memory").debug("{}", peak_buffers);
    // Outputs the arena holds (views of arena values) are copied out for the user.
    for (int o : p_.outputs) {
      if (donor[size_t(o)] < 0) c.outputs += local_bytes(p_.nodes[size_t(o)], params_);
      if (home[size_t(o)] == Home::Arena) held += local_bytes(p_.nodes[size_t(o)], params_);
    }
    c.peak = std::max(c.peak, held);
    return c;
  }

 private:
  struct Found {
    int64_t inner = 0, shared = 0;  // bytes of a step's values each cache holds now
  };
  // The step's values, in both caches from here on; returns the bytes of them each holds now.
  Found touch_caches(const ScheduledStep& step) {
    if (hw_.cache_bytes <= 0 && hw_.shared_cache_bytes <= 0) return {};
    std::vector<std::pair<int, int64_t>> reads, writes;
    const std::vector<int> read = step_reads(p_, step);
    for (int r : std::set<int>(read.begin(), read.end())) reads.push_back({r, local_bytes(p_.nodes[size_t(r)], params_)});
    for (int o : step.outputs) writes.push_back({o, local_bytes(p_.nodes[size_t(o)], params_)});
    return {cache_.touch(reads, writes), shared_cache_.touch(reads, writes)};
  }

  // Seconds to move a kernel's `bytes`: those the inner cache holds at its rate, those only the
  // shared one holds at its rate, the rest from memory. A kernel run on `share` of the device's
  // cores has that share of the inner caches (one per core), but the shared cache and the memory
  // at the device's rate: one core streams from them about as fast as all of them (a column
  // reduction on one core of this project's 2-core VMs read 29 GB/s, a copy split over both
  // 25-39 GB/s), and charged its share, the small kernels a step runs on one core, its bias
  // gradients and row statistics, were planned at 2-3 times their time.
  double memory_seconds(int64_t bytes, const Found& found, double share) const {
    const int64_t inner = hw_.cache_bytes_per_second > 0 ? std::min(found.inner, bytes) : 0;
    const int64_t shared =
        hw_.shared_cache_bytes_per_second > 0 ? std::clamp<int64_t>(found.shared - inner, 0, bytes - inner) : 0;
    double seconds = double(bytes - inner - shared) / hw_.memory_bytes_per_second;
    if (inner > 0) seconds += double(inner) / (hw_.cache_bytes_per_second * share);
    if (shared > 0) seconds += double(shared) / hw_.shared_cache_bytes_per_second;
    return seconds;
  }

  // `copied`: the bytes a local redistribute step (a chunk copy, a fill) writes.
  void account_time(const ScheduledStep& step, int64_t copied, DeviceCosts& c) {
    const LocalNode& n = p_.nodes[size_t(step.node)];
    double seconds = 0, flops = 0;
    int64_t bytes = 0;
    const Found found = touch_caches(step);
    if (step.kind == ScheduledStep::Kind::Redistribute) {
      bytes = received_bytes(p_, step, params_, coords_);
      if (is_collective(n.step.kind)) {
        const Link& link = p_.mesh.dim_within_node(n.step.mesh_dim) ? hw_.intra_node : hw_.inter_node;
        const int64_t k = p_.mesh.shape()[size_t(n.step.mesh_dim)];
        seconds = double(collective_hops(n.step.kind, k)) * link.latency_seconds + double(bytes) / link.bytes_per_second;
        c.collective_bytes += bytes;
      } else {  // a local chunk copy or a fill: memory traffic
        seconds = 2.0 * double(copied) / hw_.memory_bytes_per_second;
      }
    } else {
      const kir::Kernel::OpCounts evaluated = op_evaluations(p_, plan_.schedule, step, params_);  // zero but for generated kernels
      flops = double(step_flops(p_, step, params_, evaluated));
      bytes = step_bytes_touched(p_, step, params_);
      const double f32 = hw_.vector_rate(DType::f32);
      double compute = 0, moving = double(bytes) / hw_.memory_bytes_per_second;
      if (step.kind == ScheduledStep::Kind::Kernel) {
        // A kernel the device runs on one of its cores gets that core's share; special
        // functions take their own rate where the profile gives one.
        const bool split = kernel_splits_over_cores(plan_.schedule.kernels[size_t(step.kernel)], element_count(n.shape_on(params_)));
        const double share = split ? 1.0 : 1.0 / double(hw_.cores);
        // 16-bit values are computed in f32: every op at f32's rate, and each one rounded to
        // bf16 or f16 also pays the rounding, the difference between that type's rate (a
        // kernel of rounded ops) and f32's. A mixed-precision kernel mixes both.
        const DType computed_in = n.dtype == DType::f64 ? DType::f64 : DType::f32;
        const double rate = rate_or_f32(hw_.vector_rate(computed_in), f32) * share;
        double special = 0, special_seconds = 0;
        for (SpecialFunction f : kSpecialFunctions)
          if (const double count = double(evaluated.special[size_t(f)]), r = hw_.special_function_rate(computed_in, f) * share;
              count > 0 && r > 0)
            special += count, special_seconds += count / r;
        compute = (flops - special) / rate + special_seconds;
        for (const auto& [dtype, count] : {std::pair{DType::bf16, evaluated.rounded_to_bf16}, std::pair{DType::f16, evaluated.rounded_to_f16}})
          if (count > 0) compute += double(count) * std::max(0.0, 1.0 / (rate_or_f32(hw_.vector_rate(dtype), f32) * share) - 1.0 / rate);
        moving = memory_seconds(bytes, found, share);
      } else {
        const DType operands = p_.nodes[size_t(n.inputs[0])].dtype;
        const double attention = step.kind == ScheduledStep::Kind::Attention ? hw_.attention_rate(operands) : 0;
        compute = flops / (attention > 0 ? attention : rate_or_f32(hw_.gemm_rate(operands, gemm_intensity(p_, n, params_)), f32));
        // A product split over a device's cores reads operands that the step before left in
        // the other cores' caches, and packs them before it computes: on a 2-core Zen 4 guest
        // one device's GPT step ran its GEMMs at 1.06-1.72x the warm rate the profile measures
        // (the attention's batched products and the weight gradients most), where two one-core
        // devices ran the same products within 10% of it. Charged: its bytes at the memory's
        // rate, after the arithmetic rather than beside it (docs/PLANNING.md).
        if (hw_.cores > 1 && step.kind == ScheduledStep::Kind::Gemm) compute += moving;
      }
      seconds = hw_.launch_seconds + std::max(compute, moving);
      c.flops += flops;
    }
    c.seconds += seconds;
    c.step_seconds.push_back(seconds);
    c.step_flops.push_back(flops);
    c.step_bytes.push_back(bytes);
  }

  const ProgramPlan& plan_;
  const LocalProgram& p_;
  const Hardware& hw_;
  const std::vector<int64_t>& params_;
  const std::vector<int64_t> coords_;
  CacheResidency cache_, shared_cache_;
};

std::string step_kind_name(const LocalProgram& p, const ScheduledStep& step) {
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel: return "kernel";
    case ScheduledStep::Kind::Gemm: return "gemm";
    case ScheduledStep::Kind::GroupedGemm: return "grouped gemm";
    case ScheduledStep::Kind::Attention: return "attention";
    case ScheduledStep::Kind::Redistribute: return std::string(redistribute_kind_name(p.nodes[size_t(step.node)].step.kind));
  }
  return "?";
}

PlanReport::Part& part_named(std::vector<PlanReport::Part>& parts, const std::string& name) {
  for (auto& part : parts)
    if (part.name == name) return part;
  parts.push_back(PlanReport::Part{name});
  return parts.back();
}

}  // namespace

PlanReport plan_report(const ProgramPlan& plan, const Hardware& hardware) {
  const LocalProgram& p = plan.program;
  PlanReport r;
  r.hardware = hardware.name;
  r.mesh = p.mesh.dims_string();
  r.devices = p.mesh.size();
  const std::vector<int64_t>& ids = p.device_ids;
  std::vector<DeviceCosts> costs;
  for (size_t d = 0; d < ids.size(); ++d) {
    costs.push_back(DeviceWalk(plan, hardware, p.device_params[d], p.mesh.coords(ids[d])).run());
    r.device_ids.push_back(ids[d]);
    r.device_peak_bytes.push_back(costs.back().peak);
    r.device_collective_bytes.push_back(costs.back().collective_bytes);
    r.output_bytes_per_device.push_back(costs.back().outputs);
  }
  size_t most = 0, slowest = 0;
  for (size_t d = 0; d < costs.size(); ++d) {
    if (costs[d].peak > costs[most].peak) most = d;
    if (costs[d].seconds > costs[slowest].seconds) slowest = d;
    r.flops = std::max(r.flops, costs[d].flops);
    r.collective_bytes = std::max(r.collective_bytes, costs[d].collective_bytes);
  }
  if (costs.empty()) return r;  // a mesh with no device here: nothing to plan for
  const DeviceCosts& m = costs[most];
  r.device = ids[most];
  r.peak_bytes = m.peak;
  r.input_bytes = m.inputs;
  r.output_bytes = m.outputs;
  r.arena_bytes = plan.memory.arena_bytes;
  r.fits = hardware.memory_bytes <= 0 || r.peak_bytes <= hardware.memory_bytes;
  // The step takes as long as its slowest device; its breakdown is that device's.
  const DeviceCosts& s = costs[slowest];
  r.predicted_seconds = s.seconds;
  for (size_t i = 0; i < plan.schedule.steps.size(); ++i) {
    const ScheduledStep& step = plan.schedule.steps[i];
    const LocalNode& n = p.nodes[size_t(step.node)];
    const double flops = s.step_flops[i];
    r.steps.push_back({step_kind_name(p, step), 1, flops, s.step_bytes[i], s.step_seconds[i]});
    for (PlanReport::Part* part : {&part_named(r.by_op_kind, step_kind_name(p, step)),
                                   &part_named(r.by_module, n.origin.module ? *n.origin.module : std::string("(no module)"))}) {
      ++part->steps;
      part->flops += flops;
      part->bytes += s.step_bytes[i];
      part->seconds += s.step_seconds[i];
    }
    if (step.kind != ScheduledStep::Kind::Redistribute || !is_collective(n.step.kind)) continue;
    const std::string kind(redistribute_kind_name(n.step.kind)), dim = p.mesh.dim_names()[size_t(n.step.mesh_dim)];
    auto it = std::find_if(r.collectives.begin(), r.collectives.end(), [&](const auto& c) { return c.kind == kind && c.mesh_dim == dim; });
    if (it == r.collectives.end()) {
      r.collectives.push_back({kind, dim, p.mesh.shape()[size_t(n.step.mesh_dim)], p.mesh.dim_within_node(n.step.mesh_dim)});
      it = r.collectives.end() - 1;
    }
    ++it->calls;
    it->bytes += s.step_bytes[i];
    it->seconds += s.step_seconds[i];
  }
  return r;
}

Hardware planning_hardware(const Mesh& mesh) {
  if (mesh.is_abstract()) return mesh.hardware();
  if (mesh.device_kind() == DeviceKind::GPU) return hardware_profile("h100-sxm");
  return this_machine_device(mesh.num_local_devices());
}

std::string PlanReport::to_string() const {
  std::string out = fmt::format("plan on {} x {} ({}), most loaded device {}\n", devices, hardware, mesh, device);
  out += fmt::format("  peak memory  {} per device ({}): inputs {}, outputs {}, arena {}\n", bytes_text(double(peak_bytes)),
                     fits ? "fits" : "DOES NOT FIT", bytes_text(double(input_bytes)), bytes_text(double(output_bytes)),
                     bytes_text(double(arena_bytes)));
  out += fmt::format("  compute      {:.4g} FLOPs per device\n", flops);
  out += fmt::format("  collectives  {} received per device\n", bytes_text(double(collective_bytes)));
  out += fmt::format("  predicted    {} per call\n", seconds_text(predicted_seconds));
  if (!collectives.empty()) {
    out += fmt::format("  {:<16}{:<10}{:>6}  {:<11}{:>6}{:>14}{:>12}\n", "collective", "mesh dim", "group", "link", "calls", "bytes", "time");
    for (const Collective& c : collectives)
      out += fmt::format("  {:<16}{:<10}{:>6}  {:<11}{:>6}{:>14}{:>12}\n", c.kind, c.mesh_dim, c.group_size,
                         c.within_node ? "intra-node" : "inter-node", c.calls, bytes_text(double(c.bytes)), seconds_text(c.seconds));
  }
  for (const auto& [title, parts] : {std::pair{"by op kind", &by_op_kind}, std::pair{"by module", &by_module}}) {
    out += fmt::format("  {:<32}{:>7}{:>12}{:>14}{:>12}\n", title, "steps", "FLOPs", "bytes", "time");
    for (const Part& part : *parts)
      out += fmt::format("  {:<32}{:>7}{:>12.4g}{:>14}{:>12}\n", part.name, part.steps, part.flops, bytes_text(double(part.bytes)),
                         seconds_text(part.seconds));
  }
  return out;
}

std::string PlanReport::to_json() const {
  nlohmann::json j = {{"hardware", hardware}, {"mesh", mesh}, {"devices", devices}, {"device", device},
                      {"peak_bytes", peak_bytes}, {"flops", flops}, {"collective_bytes", collective_bytes},
                      {"predicted_seconds", predicted_seconds}, {"input_bytes", input_bytes}, {"output_bytes", output_bytes},
                      {"arena_bytes", arena_bytes}, {"fits", fits}, {"device_ids", device_ids},
                      {"device_peak_bytes", device_peak_bytes}, {"device_collective_bytes", device_collective_bytes},
                      {"output_bytes_per_device", output_bytes_per_device}};
  j["collectives"] = nlohmann::json::array();
  for (const Collective& c : collectives)
    j["collectives"].push_back({{"kind", c.kind}, {"mesh_dim", c.mesh_dim}, {"group_size", c.group_size},
                                {"within_node", c.within_node}, {"calls", c.calls}, {"bytes", c.bytes}, {"seconds", c.seconds}});
  for (const auto& [key, parts] : {std::pair{"by_op_kind", &by_op_kind}, std::pair{"by_module", &by_module}}) {
    j[key] = nlohmann::json::array();
    for (const Part& part : *parts)
      j[key].push_back({{"name", part.name}, {"steps", part.steps}, {"flops", part.flops}, {"bytes", part.bytes}, {"seconds", part.seconds}});
  }
  return j.dump(2);
}

}  // namespace tessera
