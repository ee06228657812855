#include "codegen/loop_capabilities.hpp"

namespace tessera {

LoopCapabilities loop_capabilities(kir::LoopTarget target) {
  switch (target) {
    case kir::LoopTarget::Cpu: return {};
    case kir::LoopTarget::Cuda: return {.thread_per_iteration = true, .lanes = true};
  }
  return {};
}

}  // namespace tessera
