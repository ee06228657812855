#include "dsl/user_frame.hpp"

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

namespace tessera {
namespace {

thread_local std::vector<SourceLocation> scopes;

constexpr std::array<std::string_view, 9> kLibraryFolders = {"dsl", "comm", "ir", "partitioner", "codegen", "jit", "backend", "nn", "plan"};

// The prefix this build's compiler gives the library's sources ("../" from a build folder, or
// an absolute source root): this file's name less "dsl/user_frame.cpp".
std::string_view source_root() {
  static const std::string root = [] {
    const std::string_view self = __FILE__, tail = "dsl/user_frame.cpp";
    return std::string(self.ends_with(tail) ? self.substr(0, self.size() - tail.size()) : std::string_view());
  }();
  return root;
}

bool starts_with_library_folder(std::string_view rest) {
  for (std::string_view folder : kLibraryFolders)
    if (rest.size() > folder.size() && rest.starts_with(folder) && rest[folder.size()] == '/') return true;
  return false;
}

}  // namespace

bool is_library_file(std::string_view file) {
  const std::string_view root = source_root();
  if (!root.empty() && file.starts_with(root) && starts_with_library_folder(file.substr(root.size()))) return true;
  constexpr std::string_view installed = "include/tessera/";
  const size_t at = file.rfind(installed);
  return at != std::string_view::npos && starts_with_library_folder(file.substr(at + installed.size()));
}

SourceLocation user_frame(const SourceLocation& where) {
  // Called for every node built: no scope open (the user's own ops) costs nothing, and a file's
  // answer is kept by its name's address (the compiler's string literal, one per file).
  if (scopes.empty()) return where;
  thread_local std::unordered_map<const char*, bool> library;
  auto in_library = [](const char* file) {
    auto [it, fresh] = library.try_emplace(file, false);
    if (fresh) it->second = is_library_file(file);
    return it->second;
  };
  if (!in_library(where.file_name())) return where;
  for (auto it = scopes.rbegin(); it != scopes.rend(); ++it)
    if (!in_library(it->file_name())) return *it;
  return where;
}

UserCallScope::UserCallScope(const SourceLocation& caller) { scopes.push_back(caller); }
UserCallScope::~UserCallScope() { scopes.pop_back(); }

}  // namespace tessera
