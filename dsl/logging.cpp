#include "dsl/logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "dsl/string_util.hpp"

namespace tessera {
namespace {

spdlog::level::level_enum level_for(std::string_view component) {
  const char* setting = std::getenv("TESSERA_LOG");
  if (!setting || !*setting) return spdlog::level::warn;
  std::string text(setting);
  auto global = spdlog::level::from_str(text);
  if (global != spdlog::level::off || text == "off") return global;
  for (const auto& item : split(text, ','))
    if (trim(item) == component || trim(item) == "all") return spdlog::level::debug;
  return spdlog::level::warn;
}

}  // namespace

spdlog::logger& component_logger(std::string_view component) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  std::lock_guard lock(mutex);
  auto it = loggers.find(component);
  if (it == loggers.end()) {
    auto logger = spdlog::stderr_color_mt("tessera." + std::string(component));
    logger->set_level(level_for(component));
    logger->set_pattern("[%H:%M:%S.%e] [%n] [%l] %v");
    it = loggers.emplace(std::string(component), std::move(logger)).first;
  }
  return *it->second;
}

}  // namespace tessera
