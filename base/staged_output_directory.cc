#include "base/staged_output_directory.h"

#include <signal.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>

#include "base/file_sync.h"

namespace peerserve {

namespace fs = std::filesystem;

Status check_output_directory(const std::string& out_dir) {
  if (out_dir.empty()) return invalid_argument("no output directory given");
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return ok_status();
  if (!fs::is_directory(out_dir, ec)) {
    return invalid_argument("the output " + out_dir + " exists and is not a directory");
  }
  if (!fs::is_empty(out_dir, ec) || ec) {
    return invalid_argument("the output directory " + out_dir +
                            " exists and is not empty; remove it or choose another (nothing is "
                            "overwritten)");
  }
  return ok_status();
}

namespace {

// This host's name, in staging folder names: a process id means something only on its host
// (a shared volume may hold another host's staging folder).
std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "host";
  std::string out(name);
  for (char& c : out) {
    if (c == '/' || c == '-') c = '_';
  }
  return out;
}

// Removes `<name>.partial-<host>-<pid>` folders in `parent` of this host whose process no
// longer runs.
void remove_abandoned_staging(const fs::path& parent, const std::string& name) {
  const std::string prefix = name + ".partial-" + host_name() + "-";
  std::error_code ec;
  const fs::directory_iterator end;
  for (fs::directory_iterator it(parent, ec); !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string file = entry.path().filename().string();
    if (file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = file.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    std::error_code is_dir_ec;
    if (pid <= 0 || pid == ::getpid() || !entry.is_directory(is_dir_ec)) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running (or not ours)
    std::fprintf(stderr, "removing %s, left by an interrupted run (process %d is gone)\n",
                 entry.path().c_str(), static_cast<int>(pid));
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
  }
}

}  // namespace

std::filesystem::path staging_path_for(const std::filesystem::path& out, int pid) {
  return out.string() + ".partial-" + host_name() + "-" + std::to_string(pid);
}

Result<StagedOutputDirectory> StagedOutputDirectory::begin(const std::string& out_dir) {
  PS_RETURN_IF_ERROR(check_output_directory(out_dir));
  std::error_code ec;
  const fs::path target = fs::absolute(fs::path(out_dir), ec).lexically_normal();
  if (ec) return io_error(out_dir + ": " + ec.message());
  // With a trailing slash the name is empty: take the last named component.
  fs::path out = target.filename().empty() ? target.parent_path() : target;
  // A link to an empty directory: write where it points (publishing replaced the link with a
  // directory of its own, on the link's disk). A link to nothing is refused.
  if (fs::is_symlink(out, ec)) {
    if (!fs::exists(out, ec)) {
      return invalid_argument("the output " + out_dir + " is a symbolic link to nothing");
    }
    out = fs::canonical(out, ec);
    if (ec) return io_error(out_dir + ": cannot resolve the link: " + ec.message());
  }
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  if (ec)
    return io_error(out.parent_path().string() + ": cannot create directory: " + ec.message());
  remove_abandoned_staging(out.parent_path(), out.filename().string());
  fs::path staging = staging_path_for(out, ::getpid());
  fs::remove_all(staging, ec);
  fs::create_directory(staging, ec);
  if (ec) return io_error(staging.string() + ": cannot create directory: " + ec.message());
  return StagedOutputDirectory(std::move(staging), out);
}

StagedOutputDirectory::StagedOutputDirectory(StagedOutputDirectory&& other) noexcept
    : staging_(std::move(other.staging_)), out_(std::move(other.out_)) {
  other.staging_.clear();
}

StagedOutputDirectory::~StagedOutputDirectory() {
  if (staging_.empty()) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

Status StagedOutputDirectory::publish() {
  if (staging_.empty()) return internal_error("the staging folder was already published");
  PS_RETURN_IF_ERROR(check_output_directory(out_.string()));
  // Synced before the user's empty directory is touched (a failed sync had removed it) and
  // before the rename, so the name never points at unwritten data after a power loss.
  PS_RETURN_IF_ERROR(sync_tree(staging_));
  std::error_code ec;
  if (fs::exists(out_, ec)) {
    // The empty directory a user made keeps its permissions (one made private stays so).
    const fs::perms mode = fs::status(out_, ec).permissions();
    if (!ec) fs::permissions(staging_, mode, ec);
    if (ec) return io_error(out_.string() + ": cannot take its permissions: " + ec.message());
    fs::remove(out_, ec);  // empty: checked
    if (ec)
      return io_error(out_.string() + ": cannot replace the empty directory: " + ec.message());
  }
  fs::rename(staging_, out_, ec);
  if (ec) {
    return io_error("cannot rename " + staging_.string() + " to " + out_.string() + ": " +
                    ec.message());
  }
  staging_.clear();
  return sync_path(fs::absolute(out_).parent_path());
}

}  // namespace peerserve
