// The samples' output files, written so that a link planted where one goes is never followed.
// An output folder may be shared (/tmp/out): a symbolic link named metrics.csv put there by
// another user made the sample overwrite whatever file the link pointed to, with the sample's
// rights. A file is made afresh as a temporary beside its name (mkstemp: O_EXCL, never through a
// link) and renamed over the name, which replaces a link there rather than writing through it;
// a file appended to is opened with O_NOFOLLOW and must be a regular file of one link.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <tessera/tessera.hpp>

namespace samples {

class OutputFile {
 public:
  // A new file for `dir`/`name`, written as a temporary in `dir`; nothing at the name changes
  // until commit(), and a file never committed is removed. IOError naming the folder.
  static OutputFile replacing(const std::string& dir, const std::string& name) {
    OutputFile f(dir + "/" + name);
    f.temporary_ = dir + "/." + name + ".XXXXXX";
    f.fd_ = ::mkostemp(f.temporary_.data(), O_CLOEXEC);
    if (f.fd_ < 0) {
      const int error = errno;
      f.temporary_.clear();  // nothing made: nothing to remove
      errno = error;
      fail("cannot create a temporary file in '" + dir + "' for " + name);
    }
    ::fchmod(f.fd_, 0644);  // mkstemp's 0600 would hide the results from the user's other tools
    return f;
  }

  // `dir`/`name`, which exists, appended to. IOError when it is a symbolic link or anything but a
  // regular file of one link (a hard link planted to another file).
  static OutputFile appending(const std::string& dir, const std::string& name) {
    OutputFile f(dir + "/" + name);
    f.fd_ = ::open(f.path_.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (f.fd_ < 0 && errno == ELOOP)
      throw tessera::IOError("'" + f.path_ + "' is a symbolic link; refusing to append to the file it points to");
    if (f.fd_ < 0) fail("cannot open '" + f.path_ + "' to append to it");
    struct stat st {};
    if (::fstat(f.fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1)
      throw tessera::IOError("'" + f.path_ + "' is not a regular file of one link; refusing to append to it");
    return f;
  }

  OutputFile(OutputFile&& other) noexcept
      : path_(std::move(other.path_)), temporary_(std::exchange(other.temporary_, {})), fd_(std::exchange(other.fd_, -1)) {}
  OutputFile& operator=(OutputFile&&) = delete;
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!temporary_.empty()) ::unlink(temporary_.c_str());
  }

  void write(std::string_view text) {
    while (!text.empty()) {
      const ssize_t n = ::write(fd_, text.data(), text.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot write '" + path_ + "'");
      text.remove_prefix(size_t(n));
    }
  }

  // Puts the temporary in place under the name (replacing); the file stays open for writing.
  void commit() {
    if (temporary_.empty()) return;
    if (::rename(temporary_.c_str(), path_.c_str()) != 0) fail("cannot rename a temporary file to '" + path_ + "'");
    temporary_.clear();
  }

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  explicit OutputFile(std::string path) : path_(std::move(path)) {}
  [[noreturn]] static void fail(const std::string& what) { throw tessera::IOError(what + ": " + std::strerror(errno)); }

  std::string path_, temporary_;
  int fd_ = -1;
};

}  // namespace samples
