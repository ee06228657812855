#include "jit/private_files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

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

int create_fresh_file(const std::string& path, mode_t mode, std::string& created) {
  // 64 random bits per try: a name no one can guess ahead; retried only if one is taken.
  for (int attempt = 0; attempt < 16; ++attempt) {
    uint64_t random = 0;
    if (::getrandom(&random, sizeof random, 0) != ssize_t(sizeof random)) return -1;
    const std::string name = fmt::format("{}.{:016x}.tmp", path, random);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) {
      created = name;
      return fd;
    }
    if (errno != EEXIST) return -1;
  }
  errno = EEXIST;
  return -1;
}

bool write_all(int fd, const void* from, size_t bytes) {
  const auto* at = static_cast<const char*>(from);
  while (bytes > 0) {
    const ssize_t put = ::write(fd, at, bytes);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    at += put;
    bytes -= size_t(put);
  }
  return true;
}

}  // namespace tessera
