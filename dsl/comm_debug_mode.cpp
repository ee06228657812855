#include "dsl/comm_debug_mode.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dsl/error.hpp"
#include "dsl/live_registry.hpp"

namespace tessera {

struct CommDebugMode::ParameterLog {
  std::map<std::string, std::map<std::string, Tensor>> values;  // module -> name -> value
};

namespace {

LiveRegistry<CommDebugMode::ParameterLog>& parameter_logs() {
  static auto& registry = *new LiveRegistry<CommDebugMode::ParameterLog>();
  return registry;
}

// Modules as a tree, children in the order they first ran a collective; counts and bytes
// include submodules.
struct ModuleTree {
  std::string path;  // "" for the root (PyTorch's "Global")
  std::vector<const CollectiveRecord*> own;
  std::vector<std::unique_ptr<ModuleTree>> children;
  int64_t count = 0, bytes = 0;

  void add(const CollectiveRecord& r) {
    ModuleTree* node = this;
    node->count += 1;
    node->bytes += r.bytes;
    for (size_t begin = 0; !r.module.empty() && begin <= r.module.size();) {
      size_t dot = r.module.find('.', begin);
      if (dot == std::string::npos) dot = r.module.size();
      const std::string prefix = r.module.substr(0, dot);
      auto it = std::find_if(node->children.begin(), node->children.end(), [&](const auto& c) { return c->path == prefix; });
      if (it == node->children.end()) {
        node->children.push_back(std::make_unique<ModuleTree>());
        node->children.back()->path = prefix;
        it = node->children.end() - 1;
      }
      node = it->get();
      node->count += 1;
      node->bytes += r.bytes;
      begin = dot + 1;
    }
    node->own.push_back(&r);
  }
};

std::string plural(int64_t n, const char* word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

std::map<std::string, int64_t> sum_by_kind(const std::vector<CollectiveRecord>& records, bool bytes) {
  std::map<std::string, int64_t> out;
  for (const auto& r : records) out[r.kind] += bytes ? r.bytes : 1;
  return out;
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IOError(fmt::format("CommDebugMode: cannot write {} to '{}': {}", what, path, std::strerror(errno)));
  out << text;
  out.close();
  if (!out) throw IOError(fmt::format("CommDebugMode: writing {} to '{}' failed", what, path));
}

}  // namespace

CommDebugMode::CommDebugMode() : parameters_(parameter_logs().open()) {}

CommDebugMode::~CommDebugMode() { parameter_logs().close(parameters_); }

void CommDebugMode::compute_pending() const {
  const std::vector<NodeRef> pending = pending_.pending_results();
  if (!pending.empty()) force_values(pending);
}

std::vector<CollectiveRecord> CommDebugMode::records() const {
  compute_pending();
  return recorder_.records();
}

std::map<std::string, int64_t> CommDebugMode::counts() const { return sum_by_kind(records(), false); }

std::map<std::string, int64_t> CommDebugMode::bytes_by_kind() const { return sum_by_kind(records(), true); }

int64_t CommDebugMode::total_bytes() const {
  int64_t total = 0;
  for (const auto& [kind, n] : bytes_by_kind()) total += n;
  return total;
}

int64_t CommDebugMode::total_count() const { return int64_t(records().size()); }

std::string CommDebugMode::generate_comm_debug_tracing_table(int noise_level) const {
  const std::vector<CollectiveRecord> all = records();
  ModuleTree root;
  for (const auto& r : all) root.add(r);
  size_t kind_w = 0, dim_w = 0, bytes_w = 0, dtype_w = 0;
  for (const auto& r : all) {
    kind_w = std::max(kind_w, r.kind.size());
    dim_w = std::max(dim_w, r.mesh_dim.size());
    bytes_w = std::max(bytes_w, std::to_string(r.bytes).size());
    dtype_w = std::max(dtype_w, r.dtype.size());
  }
  std::string by_kind;
  for (const auto& [kind, n] : sum_by_kind(all, false)) by_kind += fmt::format("{}{} {}", by_kind.empty() ? "" : ", ", kind, n);
  std::string out = fmt::format("CommDebugMode: {}, {}{}\n", plural(root.count, "collective"), plural(root.bytes, "byte"),
                                by_kind.empty() ? "" : " (" + by_kind + ")");
  auto print = [&](auto& self, const ModuleTree& m, int depth) -> void {
    const std::string indent(size_t(2 * depth), ' ');
    out += fmt::format("{}{}: {}, {}\n", indent, m.path.empty() ? "Global" : m.path, plural(m.count, "collective"),
                       plural(m.bytes, "byte"));
    for (const CollectiveRecord* r : m.own) {
      out += fmt::format("{}  {:<{}}  over {:<{}}  {:>{}} bytes  {:<{}}  at {}", indent, r->kind, kind_w, r->mesh_dim, dim_w,
                         r->bytes, bytes_w, r->dtype, dtype_w, r->source_line.empty() ? "-" : r->source_line);
      if (noise_level >= 1) out += "  on mesh " + r->mesh;
      out += "\n";
    }
    for (const auto& child : m.children) self(self, *child, depth + 1);
  };
  print(print, root, 0);
  return out;
}

std::string CommDebugMode::generate_json_dump(int noise_level) const {
  const std::vector<CollectiveRecord> all = records();
  nlohmann::ordered_json collectives = nlohmann::ordered_json::array();
  int64_t total = 0;
  for (const auto& r : all) {
    nlohmann::ordered_json c = {{"kind", r.kind}, {"mesh_dim", r.mesh_dim}, {"bytes", r.bytes}, {"dtype", r.dtype},
                                {"source_line", r.source_line}, {"module", r.module}};
    if (noise_level >= 1) c["mesh"] = r.mesh;
    collectives.push_back(std::move(c));
    total += r.bytes;
  }
  nlohmann::ordered_json j = {{"total_count", int64_t(all.size())},
                              {"total_bytes", total},
                              {"counts", sum_by_kind(all, false)},
                              {"bytes_by_kind", sum_by_kind(all, true)},
                              {"collectives", std::move(collectives)}};
  return j.dump(2) + "\n";
}

void CommDebugMode::log_comm_debug_tracing_table_to_file(const std::string& path, int noise_level) const {
  write_file(path, generate_comm_debug_tracing_table(noise_level), "the tracing table");
}

void CommDebugMode::generate_json_dump_to_file(const std::string& path, int noise_level) const {
  write_file(path, generate_json_dump(noise_level), "the JSON dump");
}

std::map<std::string, std::map<std::string, Tensor>> CommDebugMode::get_parameter_info() const {
  return parameter_logs().read(*parameters_, [](const ParameterLog& log) { return log.values; });
}

std::map<std::string, std::vector<Placement>> CommDebugMode::get_sharding_info() const {
  std::map<std::string, std::vector<Placement>> out;
  for (const auto& [module, parameters] : get_parameter_info())
    for (const auto& [name, value] : parameters) out[module + "." + name] = value.placements();
  return out;
}

void record_module_parameters(const std::string& module, const std::vector<std::pair<std::string, Tensor>>& parameters) {
  parameter_logs().for_each_open([&](CommDebugMode::ParameterLog& log) {
    auto& entry = log.values[module.empty() ? "Global" : module];
    for (const auto& [name, value] : parameters) entry.insert_or_assign(name, value);
  });
}

bool comm_debug_mode_active() { return parameter_logs().any_open(); }

}  // namespace tessera
