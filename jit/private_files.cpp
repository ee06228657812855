#include "jit/private_files.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

namespace tessera {

bool make_private_dirs(const std::string& dir) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end < dir.size() && dir[end] != '/') continue;
    if (dir[end - 1] == '/') continue;  // "//" or a trailing '/'
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      // The umask may have taken bits from 0700 (the owner's write, say): set them exactly.
      if (::chmod(prefix.c_str(), 0700) != 0) return false;
    } else if (errno != EEXIST) {
      return false;
    }
  }
  return true;
}

std::string not_private(const struct stat& st) {
  if (st.st_uid != ::geteuid()) return fmt::format("is owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return fmt::format("is writable by group or others (mode {:04o})", st.st_mode & 07777);
  return "";
}

}  // namespace tessera
