// Component loggers. TESSERA_LOG selects what is printed: a log level for everything
// ("debug", "info", ...) or a comma list of components to show at debug level
// ("partitioner,jit,comm"). Unset: warnings only.
#pragma once

#include <spdlog/logger.h>

#include <string_view>

namespace tessera {

spdlog::logger& component_logger(std::string_view component);  // "partitioner", "jit", "comm", ...

}  // namespace tessera
