// The collective recorder: while one is open, every collective that Tessera issues is kept as a
// plain record (kind, mesh dim, mesh, bytes, dtype, the user's source line and module). The
// runtime calls record_collective once per issued collective; CommDebugMode (dsl/
// comm_debug_mode.hpp) is the user-facing report built on top. A collective over a mesh
// dimension is recorded once however many groups run it (as a user of one rank sees it), and its
// bytes are the bytes all devices of the mesh received through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

struct CollectiveRecord {
  std::string kind;         // "all_gather", "all_to_all", "all_to_all_v", "all_reduce", "reduce_scatter",
                            // "shift" (local_map's shift and permute), "broadcast", "mesh_transfer"
  std::string mesh_dim;     // the mesh dim it runs over ("x", "dp")
  std::string mesh;         // the mesh's to_string()
  std::string dtype;        // element type ("float32")
  std::string source_line;  // "file.cpp:12" of the op that needs it; "" when none (checkpoints)
  std::string module;       // dotted CommModuleScope path; "" outside every module
  int64_t bytes = 0;
  bool operator==(const CollectiveRecord&) const = default;
};

// Records every collective issued between its construction and its destruction, from any
// thread, in the order they were recorded. Recorders nest: each open one gets every record.
class CollectiveRecorder {
 public:
  CollectiveRecorder();
  ~CollectiveRecorder();
  CollectiveRecorder(const CollectiveRecorder&) = delete;
  CollectiveRecorder& operator=(const CollectiveRecorder&) = delete;

  std::vector<CollectiveRecord> records() const;
  size_t size() const;

  struct Log;

 private:
  std::shared_ptr<Log> log_;
};

// Called by the runtime once per issued collective, on the thread that forced the value.
void record_collective(const CollectiveRecord& record);
// Whether any recorder is open: the runtime builds records only then.
bool collective_recording_active();

}  // namespace tessera
