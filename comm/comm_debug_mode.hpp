// CommDebugMode (PyTorch's name): while one is alive, every collective that Tessera issues is
// counted by kind ("all_gather", "all_to_all", "all_reduce", "reduce_scatter", "broadcast").
// A collective over a mesh dimension counts once however many groups run it (as a user of one
// rank sees it), and its bytes are the bytes all devices of the mesh received through it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace tessera {

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
  // PyTorch's spellings.
  std::map<std::string, int64_t> get_comm_counts() const { return counts(); }
  int64_t get_total_counts() const { return total_count(); }

  struct Tally;

 private:
  std::shared_ptr<Tally> tally_;
};

// Called by the runtime once per issued collective.
void record_collective(std::string_view kind, int64_t bytes);

}  // namespace tessera
