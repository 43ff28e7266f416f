#include "base/output_file_check.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

namespace peerserve {

Status check_output_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return invalid_argument(flag + ": an empty path");
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return invalid_argument(flag + " " + path + ": a directory, expected a file to write");
  }
  fs::path file(path);
  if (fs::exists(file, ec)) {
    // An existing file is opened for writing at the end: it must allow that now.
    if (::access(path.c_str(), W_OK) != 0) {
      return invalid_argument(flag + " " + path + ": the file exists and is not writable");
    }
    return ok_status();
  }
  // A link (or a chain of them) to a file not made yet: written where it points. 40 hops,
  // as the kernel's own limit (ELOOP).
  for (int hops = 0; fs::is_symlink(file, ec); ++hops) {
    if (hops == 40) return invalid_argument(flag + " " + path + ": too many symbolic links");
    const fs::path target = fs::read_symlink(file, ec);
    if (ec) return io_error(flag + " " + path + ": cannot read the link: " + ec.message());
    file = target.is_absolute() ? target : file.parent_path() / target;
  }
  fs::path parent = file.parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) {
    return not_found(flag + " " + path + ": no folder " + parent.string() + " to write it in");
  }
  if (::access(parent.c_str(), W_OK) != 0) {
    return invalid_argument(flag + " " + path + ": folder " + parent.string() + " is not writable");
  }
  return ok_status();
}

}  // namespace peerserve
