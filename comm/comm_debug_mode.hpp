// CommDebugMode (PyTorch's name): while one is alive, every collective that Tessera issues is
// counted by kind ("all_gather", "all_to_all", "all_reduce", "reduce_scatter", "broadcast") and
// recorded with its mesh dim, mesh, bytes, dtype, the user's source line and the module
// (CommModuleScope) that built the op it serves. Tessera is lazy: collectives run, and are
// recorded, when a value is looked at, but line and module are where the op was written.
// A collective over a mesh dimension counts once however many groups run it (as a user of one
// rank sees it), and its bytes are the bytes all devices of the mesh received through it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsl/comm_module_scope.hpp"
#include "dsl/tensor.hpp"

namespace tessera {

struct CollectiveRecord {
  std::string kind;         // "all_gather", ...
  std::string mesh_dim;     // the mesh dim it runs over ("x", "dp")
  std::string mesh;         // the mesh's to_string()
  std::string dtype;        // element type ("float32")
  std::string source_line;  // "file.cpp:12" of the op that needs it; "" when none (checkpoints)
  std::string module;       // dotted CommModuleScope path; "" outside every module
  int64_t bytes = 0;
  bool operator==(const CollectiveRecord&) const = default;
};

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  std::map<std::string, int64_t> counts() const;
  int64_t total_bytes() const;
  int64_t total_count() const;
  std::map<std::string, int64_t> bytes_by_kind() const;
  std::vector<CollectiveRecord> records() const;  // in the order they ran
  // PyTorch's spellings.
  std::map<std::string, int64_t> get_comm_counts() const { return counts(); }
  int64_t get_total_counts() const { return total_count(); }
  // PyTorch's module tracking: every Module called while the mode is alive records, as its
  // forward starts, its parameters as named_parameters() names them (submodules' too, dotted).
  // Parameter info: module path ("Global" for an unnamed root) -> parameter name -> value.
  // Sharding info: "module path.parameter name" -> the parameter's placements.
  std::map<std::string, std::map<std::string, Tensor>> get_parameter_info() const;
  std::map<std::string, std::vector<Placement>> get_sharding_info() const;

  // Reports. noise_level 0: kind, mesh dim, bytes, dtype, source line, module; 1 and up add
  // the mesh. The table nests modules (counts include submodules, as PyTorch's do); the JSON
  // lists the collectives in order, each naming its module.
  std::string generate_comm_debug_tracing_table(int noise_level = 0) const;
  std::string generate_json_dump(int noise_level = 0) const;
  // IOError naming `path` when it cannot be written.
  void log_comm_debug_tracing_table_to_file(const std::string& path, int noise_level = 0) const;
  void generate_json_dump_to_file(const std::string& path, int noise_level = 0) const;

  struct Tally;

 private:
  std::shared_ptr<Tally> tally_;
};

// Called by the runtime once per issued collective, on the thread that forced the value.
void record_collective(CollectiveRecord record);
// Called by Module as its forward starts (`module`: its dotted path, "" for the root).
void record_module_parameters(const std::string& module, const std::vector<std::pair<std::string, Tensor>>& parameters);
// Whether any CommDebugMode is alive: the runtime builds records only then.
bool comm_debug_mode_active();

}  // namespace tessera
