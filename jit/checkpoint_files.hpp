// The files of a checkpoint on disk. Reading treats them as untrusted input: only regular files
// are read, and nothing blocks (a FIFO or a device planted in the folder is an IOError, not a
// hang or an endless read).
#pragma once

#include <filesystem>
#include <string>

namespace tessera {

// The bytes of the regular file `path` (a symbolic link to one is followed); `what` says what it
// is for ("index", "variable 'w'"). IOError naming the file when it is missing or unreadable, or
// what it is instead of a regular file ("is a directory, not a regular file").
std::string read_checkpoint_file(const std::filesystem::path& path, const std::string& what);

}  // namespace tessera
