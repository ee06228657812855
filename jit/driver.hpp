// The driver: turns pending graph nodes into values. Forcing a node partitions the pending part
// of its graph, compiles it (or finds the executable in the cache by the graph's canonical
// structure: ops, shapes, dtypes, attributes, and the shapes / dtypes / layouts of the values it
// starts from) and runs it. The values computed are kept on their nodes.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/cache_key_verification.hpp"  // verify_cache_keys: executable-cache hits checked
#include "dsl/tensor.hpp"
#include "ir/local_program.hpp"

namespace tessera {

class Executable;

// force_values (declared in dsl/tensor.hpp) computes values and caches them on the nodes.

// The executable that forcing `outputs` would run (compiled if needed), without running it.
std::shared_ptr<const Executable> executable_for(const std::vector<NodeRef>& outputs,
                                                 const std::vector<std::optional<Layout>>& layouts = {});

// The executable for `outputs` together with the nodes of THIS graph bound to each of its
// program inputs. A cached executable may have been built from another graph of the same
// structure: its program().inputs are that graph's nodes, never to be used for binding.
struct BoundExecutable {
  std::shared_ptr<const Executable> executable;
  std::vector<NodeRef> inputs;  // inputs[k]: this graph's value for program input k
  // {program node, this graph's node} that each collective is reported at (Executable::run).
  std::vector<std::pair<int, NodeOrigin>> collective_origins;
};
BoundExecutable bind_executable(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts = {});

// The executable whose run computed `node`'s value (a forced node, or a jit call's output), so
// explain() of a computed tensor still shows its program; null when none did (a leaf).
std::shared_ptr<const Executable> producer_of(const NodeRef& node);
void remember_producer(const NodeRef& node, std::shared_ptr<const Executable> executable);

struct DriverStats {
  int64_t executables_built = 0;
  int64_t executable_cache_hits = 0;
};
DriverStats driver_stats();

// Forgets every executable built in this process (compiled kernels stay loaded): the next force
// of any graph partitions it afresh. For tests that compare cold and warm caches.
void clear_executable_cache();

}  // namespace tessera
