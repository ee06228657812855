// CommDebugMode (PyTorch's name): counts and reports the collectives of the work done while it
// is alive, by kind ("all_gather", "all_to_all", "all_to_all_v", "all_reduce", "reduce_scatter",
// "shift" (local_map's shift and permute), "broadcast", "mesh_transfer"), each with its mesh dim,
// mesh, bytes, dtype, the user's source line and the module (CommModuleScope) that built the op
// it serves.
//
// Tessera is lazy: collectives run when a value is looked at. So that the counts are those of
// the work written inside the mode, as PyTorch (eager) counts them at the call, reading the
// counts while the mode is alive first computes every value built inside it that is still
// pending, together in one program. Looking at those values afterwards runs nothing again, so
// nothing is counted twice. Line and module are where the op was written.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsl/collective_recorder.hpp"
#include "dsl/comm_module_scope.hpp"
#include "dsl/pending_values.hpp"
#include "dsl/tensor.hpp"

namespace tessera {

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  // Each of these first computes the values built inside the mode that are still pending.
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

  struct ParameterLog;

 private:
  void compute_pending() const;

  PendingValueWatch pending_;
  CollectiveRecorder recorder_;
  std::shared_ptr<ParameterLog> parameters_;
};

// Called by Module as its forward starts (`module`: its dotted path, "" for the root).
void record_module_parameters(const std::string& module, const std::vector<std::pair<std::string, Tensor>>& parameters);
// Whether any CommDebugMode is alive (Module records its parameters only then).
bool comm_debug_mode_active();

}  // namespace tessera
