// Files only this user can have written, for data that is run as code (the compile cache's
// objects). As ssh treats its keys: a folder or file owned by another user, or writable by group
// or others, is not trusted; folders made here are 0700.
#pragma once

#include <sys/stat.h>

#include <string>

namespace tessera {

// Creates the absolute path `dir` and its missing parents with mode 0700 (whatever the umask);
// false when one cannot be made. Existing folders are left as they are.
bool make_private_dirs(const std::string& dir);

// Why the file or folder `st` describes is not private to this user ("is owned by uid 5, not by
// this user (uid 0)", "is writable by group or others (mode 0777)"); "" when it is.
std::string not_private(const struct stat& st);

}  // namespace tessera
