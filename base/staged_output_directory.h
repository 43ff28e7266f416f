// StagedOutputDirectory: a checkpoint folder written whole or not at all. Its files go into
// `<out>.partial-<host>-<pid>` beside the output; publish() renames that folder to the output,
// which must not exist or be empty. Until then the output is untouched, and a staging folder
// that is destroyed unpublished removes what it holds: a failed or interrupted writer never
// leaves a half-written checkpoint that loads, nor mixes new files with an old one's.
// publish() syncs the files before the rename and the parent folder after it, so a power loss
// leaves no output naming unwritten data.
#pragma once

#include <filesystem>
#include <string>

#include "base/status.h"

namespace peerserve {

// OK when `out_dir` does not exist or is an empty directory; otherwise an error naming it.
Status check_output_directory(const std::string& out_dir);

// The staging folder of output `out` for process `pid` of this host:
// `<out>.partial-<host>-<pid>` (a process id means something only on its own host).
std::filesystem::path staging_path_for(const std::filesystem::path& out, int pid);

class StagedOutputDirectory {
 public:
  // Checks the output, creates its parent folders and the staging folder. A staging folder
  // of the same output left by a process that is gone (killed mid-write) is removed first.
  static Result<StagedOutputDirectory> begin(const std::string& out_dir);

  StagedOutputDirectory(StagedOutputDirectory&& other) noexcept;
  StagedOutputDirectory& operator=(StagedOutputDirectory&&) = delete;
  StagedOutputDirectory(const StagedOutputDirectory&) = delete;
  StagedOutputDirectory& operator=(const StagedOutputDirectory&) = delete;
  ~StagedOutputDirectory();

  // Where to write the files.
  const std::filesystem::path& path() const { return staging_; }
  // Moves the staging folder to the output (checked again: nobody may have filled it since).
  Status publish();

 private:
  StagedOutputDirectory(std::filesystem::path staging, std::filesystem::path out)
      : staging_(std::move(staging)), out_(std::move(out)) {}

  std::filesystem::path staging_;  // empty once published or moved from
  std::filesystem::path out_;
};

}  // namespace peerserve
