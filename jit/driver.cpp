#include "jit/driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "dsl/deep_stack.hpp"
#include "dsl/concrete_value.hpp"
#include "dsl/error.hpp"
#include "dsl/hardware.hpp"
#include "dsl/logging.hpp"
#include "dsl/string_util.hpp"
#include "dsl/tensor.hpp"
#include "jit/executable.hpp"
#include "jit/backend_registry.hpp"
#include "jit/kernel_runner.hpp"
#include "jit/library_fallback.hpp"
#include "jit/mesh_agreement.hpp"
#include "jit/mesh_transfer.hpp"
#include "jit/program_plan.hpp"
#include "dsl/determinism.hpp"
#include "partitioner/sharding_rules.hpp"
#include "partitioner/spmd_expansion.hpp"

namespace tessera {
namespace {

// The Target of a program computing `outputs`: its mesh's (the first output's with one, as the
// partitioner takes it); a graph with none is refused by the partitioner, its target the CPU's.
Target program_target(const std::vector<NodeRef>& outputs, bool deterministic) {
  DeviceKind kind = DeviceKind::CPU;
  for (const NodeRef& out : outputs)
    if (out->mesh.is_valid()) {
      if (out->mesh.is_abstract()) return abstract_target(out->mesh.device_kind(), "abstract " + out->mesh.hardware().name, deterministic);
      kind = out->mesh.device_kind();
      break;
    }
  return has_backend(kind) ? target_for(kind, deterministic) : Target{kind, deterministic, {}, {}};
}

// The pending graph in canonical order: post-order from the outputs, computed values as inputs.
struct CanonicalGraph {
  uint64_t hash = 0;         // the executable cache key (includes this client's devices)
  uint64_t fingerprint = 0;  // the same without anything client-specific: compared across clients
  // The hash again with what made each computed input (its op, attributes): equal for the same
  // call site's graphs, so a verified cache hit need not be verified again for it.
  uint64_t detail = 0;
  std::vector<NodeRef> inputs;  // values the graph starts from, in traversal order
  // Every node in traversal order (the same for every graph of this structure); they live as
  // long as the outputs do.
  std::vector<const NodeRef*> nodes;
  // What the program is compiled for, made once here, where the graph is bound: its mesh's
  // backend's description and TESSERA_DETERMINISTIC, read here and nowhere downstream.
  Target target;
};

CanonicalGraph canonicalise(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts) {
  CanonicalGraph g;
  // Structure hashes cover the global meaning; the meshes' local devices are added to the key.
  std::unordered_map<const Node*, uint64_t> hashes;
  std::vector<Mesh> meshes;   // distinct meshes (== is a pointer compare for the same handle)
  std::vector<Mesh> objects;  // distinct mesh objects, each checked once here, not at every node
  auto note = [&](const Mesh& m) {
    if (!m.is_valid()) return;
    // Before the cache is asked: a client finding the program there would skip the check its
    // peers compiling it make.
    if (std::none_of(objects.begin(), objects.end(), [&](const Mesh& o) { return o.same_instance(m); })) {
      check_clients_agree_on_mesh(m);
      objects.push_back(m);
    }
    if (std::find(meshes.begin(), meshes.end(), m) == meshes.end()) meshes.push_back(m);
  };
  // A node's hash once its inputs' are known; `n` is the graph's own handle (g.nodes keeps its address).
  auto settle = [&](const NodeRef& n) {
    uint64_t h;
    if (auto value = n->value()) {
      h = hash_mix(hash_mix(0x1a9u, uint64_t(n->dtype)), g.inputs.size());
      for (int64_t e : n->shape) h = hash_mix(h, uint64_t(e));
      h = hash_mix(h, value->layout.global_hash());
      note(value->layout.mesh());
      g.detail = hash_mix(hash_mix(g.detail, g.inputs.size()), n->local_hash);
      g.inputs.push_back(n);
    } else {
      h = n->local_hash;
      // Scope positions reorder the program (dsl/program_order_scope.hpp), so they are part of it.
      if (n->program_order >= 0) h = hash_mix(h, uint64_t(n->program_order) + 0x0de5u);
      for (const auto& in : n->inputs) h = hash_mix(h, hashes.at(in.get()));
      note(n->mesh);
    }
    hashes[n.get()] = h;
    g.nodes.push_back(&n);
    return h;
  };
  // Depth first, inputs in order before the node, with a stack of its own: this runs at every
  // forced value, and a chain of dependent ops is as long as the user makes it.
  std::vector<std::pair<const NodeRef*, size_t>> pending;  // a node and its next input
  auto visit = [&](const NodeRef& root) {
    if (auto it = hashes.find(root.get()); it != hashes.end()) return it->second;
    pending.push_back({&root, 0});
    uint64_t h = 0;
    while (!pending.empty()) {
      auto& [n, next] = pending.back();
      const NodeRef& node = *n;
      if (!node->value() && next < node->inputs.size()) {
        const NodeRef& in = node->inputs[next++];
        if (!hashes.count(in.get())) pending.push_back({&in, 0});
        continue;
      }
      h = settle(node);
      pending.pop_back();
    }
    return h;
  };
  const bool deterministic = deterministic_mode();  // read here, once per binding
  uint64_t structure = 0xca70u;
  for (size_t i = 0; i < outputs.size(); ++i) {
    structure = hash_mix(structure, visit(outputs[i]));
    structure = hash_mix(structure, i < layouts.size() && layouts[i] ? layouts[i]->global_hash() : 0x2du);
    if (i < layouts.size() && layouts[i]) note(layouts[i]->mesh());
  }
  g.target = program_target(outputs, deterministic);
  // The fingerprint (compared between clients) covers what changes the program; the key adds
  // what only this client's compiled code depends on.
  g.fingerprint = hash_mix(hash_mix(structure, g.target.deterministic), g.target.library.bits());
  g.hash = hash_text(g.fingerprint, g.target.arch);
  for (const Mesh& m : meshes) g.hash = hash_text(g.hash, m.to_string());
  if (auto target = substitute_lowering_target()) g.hash = hash_mix(g.hash, 0x7a76u + uint64_t(*target));  // lowered otherwise
  g.detail = hash_mix(g.detail, g.hash);
  return g;
}

struct CachedExecutable {
  std::shared_ptr<const Executable> executable;
  std::vector<int> input_positions;  // program input k = canonical input input_positions[k]
  // The program's canonical text, kept when cache keys are verified (verify_cache_keys()), and
  // the details (CanonicalGraph::detail) of the graphs already verified against it: a training
  // loop's steps are verified once, not partitioned again at every step.
  std::string canonical_text;
  std::unordered_set<uint64_t> verified_details;
  // {program node, canonical node position} of each collective's origin, so a later graph of
  // the same structure reports its collectives at its own lines and modules.
  std::vector<std::pair<int, int>> origin_positions;
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<uint64_t, CachedExecutable> entries;
  DriverStats stats;
};

Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

// TESSERA_DUMP=dir: the partitioned program and its kernels' IR, next to the LLVM IR the
// compiler writes there.
void dump_program(uint64_t hash, const std::string& program_text, const Executable& exe) {
  const char* dir = std::getenv("TESSERA_DUMP");
  if (!dir || !*dir) return;
  std::filesystem::create_directories(dir);
  std::ofstream out(std::string(dir) + "/" + fmt::format("program_{:016x}.txt", hash));
  out << program_text << "\n";
  for (size_t k = 0; k < exe.schedule().kernels.size(); ++k) out << "kernel " << k << ":\n" << exe.schedule().kernels[k].to_string() << "\n";
}

// The program inputs' positions among the graph's canonical inputs.
std::vector<int> input_positions(const LocalProgram& program, const CanonicalGraph& g) {
  std::unordered_map<const Node*, int> position;
  for (size_t i = 0; i < g.inputs.size(); ++i) position[g.inputs[i].get()] = int(i);
  std::vector<int> out;
  for (const auto& in : program.inputs) out.push_back(position.at(in.get()));
  return out;
}

// A cache hit, checked: this graph partitioned afresh must give the cached program exactly.
// Anything the partitioner reads that the key leaves out would show here as two programs under
// one key (once: a factory's Partial value read through a program cached for every Partial input).
void verify_cache_hit(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts,
                      const CanonicalGraph& g, const CachedExecutable& cached) {
  const FallbackGraph graph = with_library_fallbacks(outputs, g.target);
  const LocalProgram program = partition(PartitionRequest{graph.outputs, layouts, g.target});
  const std::string text = program.canonical_text();
  if (text == cached.canonical_text && input_positions(program, g) == cached.input_positions) return;
  throw InternalError(fmt::format("the executable cache gave key {:016x} to two different programs (a key misses something "
                                  "the partitioner reads):\n-- cached:\n{}-- this graph:\n{}",
                                  g.hash, cached.canonical_text, text));
}

const CachedExecutable& lookup(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts,
                               const CanonicalGraph& g) {
  Cache& c = cache();
  const bool verify = verify_cache_keys();
  {
    std::unique_lock lock(c.mutex);
    if (auto it = c.entries.find(g.hash); it != c.entries.end()) {
      ++c.stats.executable_cache_hits;
      CachedExecutable& hit = it->second;  // erased only by clear_executable_cache(), between runs
      if (!verify || hit.verified_details.count(g.detail)) return hit;
      lock.unlock();
      verify_cache_hit(outputs, layouts, g, hit);
      lock.lock();
      hit.verified_details.insert(g.detail);
      return hit;
    }
  }
  // Primitives the target's backend lacks, computed from their parts (the graph lives until the
  // executable is built: program nodes' origins point into it).
  const FallbackGraph graph = with_library_fallbacks(outputs, g.target);
  LocalProgram program = partition(PartitionRequest{graph.outputs, layouts, g.target});
  CachedExecutable entry;
  std::string program_text = program.to_string();
  component_logger("partitioner").debug("partitioned program:\n{}", program_text);
  if (verify) {
    entry.canonical_text = program.canonical_text();
    entry.verified_details.insert(g.detail);
  }
  entry.input_positions = input_positions(program, g);
  program.inputs.clear();  // bound by position from here on: the cache must not keep their values alive
  std::unordered_map<const Node*, int> node_position;
  for (size_t i = 0; i < g.nodes.size(); ++i) node_position[g.nodes[i]->get()] = int(i);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const LocalNode& n = program.nodes[i];
    if (n.kind != LocalNode::Kind::Redistribute || !is_collective(n.step.kind)) continue;
    NodeRef origin = n.origin.node.lock();  // the graph being compiled is alive
    if (auto it = graph.stands_for.find(origin.get()); it != graph.stands_for.end()) origin = it->second;
    if (auto it = node_position.find(origin.get()); origin && it != node_position.end())
      entry.origin_positions.emplace_back(int(i), it->second);
  }
  // Lowering a fused kernel recurses along its chain of ops (dsl/deep_stack.hpp).
  entry.executable = on_deep_stack([&] { return std::make_shared<const Executable>(std::move(program), g.fingerprint); });
  dump_program(g.hash, program_text, *entry.executable);
  std::lock_guard lock(c.mutex);
  ++c.stats.executables_built;
  return c.entries.emplace(g.hash, std::move(entry)).first->second;
}

}  // namespace


BoundExecutable bind_executable(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts) {
  CanonicalGraph g = canonicalise(outputs, layouts);
  const CachedExecutable& entry = lookup(outputs, layouts, g);
  BoundExecutable bound{entry.executable, {}, {}};
  for (int position : entry.input_positions) bound.inputs.push_back(g.inputs[position]);
  for (const auto& [node, position] : entry.origin_positions) bound.collective_origins.emplace_back(node, NodeOrigin(*g.nodes[position]));
  return bound;
}

ProgramPlan plan_program(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts) {
  const Target target = program_target(outputs, deterministic_mode());  // nothing cached: no key to hash
  const FallbackGraph graph = with_library_fallbacks(outputs, target);
  LocalProgram program = partition(PartitionRequest{graph.outputs, layouts, target});
  if (spdlog::logger& log = component_logger("partitioner"); log.should_log(spdlog::level::debug))  // the text is a few % of a plan
    log.debug("planned program:\n{}", program.to_string());
  // Counting a fused kernel's ops lowers it, which recurses along its chain (dsl/deep_stack.hpp).
  return on_deep_stack([&] { return plan_local_program(std::move(program)); });
}

std::shared_ptr<const Executable> executable_for(const std::vector<NodeRef>& outputs,
                                                 const std::vector<std::optional<Layout>>& layouts) {
  return bind_executable(outputs, layouts).executable;
}

namespace {

// The outputs' own values when every one is computed and wanted as it is; nullopt otherwise.
std::optional<std::vector<NodeValue>> values_at_hand(const std::vector<NodeRef>& outputs,
                                                     const std::vector<std::optional<Layout>>& layouts) {
  std::vector<NodeValue> out;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto value = outputs[i]->value();
    if (!value || (i < layouts.size() && layouts[i])) return std::nullopt;
    out.push_back(*value);
  }
  return out;
}

void refuse_abstract(const NodeRef& node) {
  if (node->mesh.is_valid() && node->mesh.is_abstract())
    throw MeshError("a value on abstract mesh (" + node->mesh.dims_string() + " of " + node->mesh.hardware().name + ")" +
                    " cannot be computed: its devices do not exist in this process (abstract_mesh plans programs, "
                    "step.plan(args...), and never runs them)");
}

}  // namespace

std::vector<NodeValue> force_values(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts) {
  for (const NodeRef& o : outputs) require_concrete(o, "reading a tensor's value");
  for (const NodeRef& o : outputs) refuse_abstract(o);
  if (auto values = values_at_hand(outputs, layouts)) return *values;
  compute_mesh_transfers(outputs);  // a program runs on one mesh: values from other meshes come first
  if (auto values = values_at_hand(outputs, layouts)) return *values;  // a transfer was all there was
  const BoundExecutable bound = bind_executable(outputs, layouts);
  std::vector<NodeValue> inputs;
  for (const NodeRef& in : bound.inputs) inputs.push_back(*in->value());
  std::vector<NodeValue> results = bound.executable->run(inputs, bound.collective_origins);
  for (size_t i = 0; i < outputs.size(); ++i)
    if (i >= layouts.size() || !layouts[i]) {
      outputs[i]->set_value(results[i]);
      remember_producer(outputs[i], bound.executable);
    }
  return results;
}

namespace {

struct Producers {
  std::mutex mutex;
  // Keyed by address; the weak pointer tells a live node from a later one at the same address.
  std::unordered_map<const Node*, std::pair<std::weak_ptr<const Node>, std::shared_ptr<const Executable>>> by_node;
  size_t prune_at = 1024;
};

Producers& producers() {
  static Producers* p = new Producers();
  return *p;
}

}  // namespace

void remember_producer(const NodeRef& node, std::shared_ptr<const Executable> executable) {
  Producers& p = producers();
  std::lock_guard lock(p.mutex);
  p.by_node[node.get()] = {node, std::move(executable)};
  if (p.by_node.size() >= p.prune_at) {  // forget dead nodes now and then
    std::erase_if(p.by_node, [](const auto& entry) { return entry.second.first.expired(); });
    p.prune_at = std::max<size_t>(1024, 2 * p.by_node.size());
  }
}

std::shared_ptr<const Executable> producer_of(const NodeRef& node) {
  Producers& p = producers();
  std::lock_guard lock(p.mutex);
  auto it = p.by_node.find(node.get());
  if (it == p.by_node.end() || it->second.first.lock() != node) return nullptr;
  return it->second.second;
}

void clear_executable_cache() {
  std::lock_guard lock(cache().mutex);
  cache().entries.clear();
}

DriverStats driver_stats() {
  std::lock_guard lock(cache().mutex);
  return cache().stats;
}

NodeValue force_value(const NodeRef& node) { return force_values({node}).front(); }

NodeValue force_or_abstract_value(const NodeRef& node) {
  if (auto value = node->value()) return *value;
  if (!node->mesh.is_valid() || !node->mesh.is_abstract()) return force_value(node);
  require_concrete(node, "reading a tensor's value");
  node->set_value(NodeValue{nullptr, planned_layout(node)});
  return *node->value();
}

Layout planned_layout(const NodeRef& node) { return propagated_layout(node, program_target({node}, deterministic_mode())); }

std::vector<Layout> planned_layouts(const std::vector<NodeRef>& nodes) {
  return propagated_layouts(nodes, program_target(nodes, deterministic_mode()));
}

}  // namespace tessera
