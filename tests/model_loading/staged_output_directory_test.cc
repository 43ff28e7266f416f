// A checkpoint folder is written whole or not at all (base/staged_output_directory.h):
// nothing appears at the output until publish(); an unpublished staging folder is removed; a
// non-empty output is refused and left as it was; a staging folder abandoned by a process
// that is gone is cleaned up. make-test-model writes through it.
#include "base/staged_output_directory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/checkpoint/test_model.h"
#include "tests/model_loading/scratch_dir.h"

namespace peerserve {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(StagedOutputDirectoryTest, NothingAtTheOutputUntilPublished) {
  ScratchDir scratch;
  const fs::path out = fs::path(scratch.path()) / "nested" / "model";
  {
    auto staged = StagedOutputDirectory::begin(out.string());
    ASSERT_TRUE(staged.ok()) << staged.status().to_string();
    write_file(staged->path() / "config.json", "{}");
    EXPECT_FALSE(fs::exists(out));
  }  // not published: gone, and no staging folder left beside the output
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(out.parent_path()));

  auto staged = StagedOutputDirectory::begin(out.string() + "/");  // a trailing slash too
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  write_file(staged->path() / "config.json", "{}");
  ASSERT_TRUE(staged->publish().ok());
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_EQ(std::distance(fs::directory_iterator(out.parent_path()), fs::directory_iterator()), 1);
}

TEST(StagedOutputDirectoryTest, AnEmptyOutputIsTakenANonEmptyOneRefusedAndKept) {
  ScratchDir scratch;
  const fs::path out = fs::path(scratch.path()) / "model";
  fs::create_directories(out);
  auto staged = StagedOutputDirectory::begin(out.string());
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  write_file(staged->path() / "a", "new");
  // Someone fills the output meanwhile: publishing refuses rather than mixing the two.
  write_file(out / "b", "old");
  const Status late = staged->publish();
  EXPECT_EQ(late.code(), StatusCode::kInvalidArgument) << late.to_string();
  EXPECT_FALSE(fs::exists(out / "a"));

  const auto refused = StagedOutputDirectory::begin(out.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not empty"), std::string::npos);
  write_file(fs::path(scratch.path()) / "file", "x");
  EXPECT_FALSE(StagedOutputDirectory::begin(scratch.path() + "/file").ok());
}

// An empty output directory made private on purpose stays private: the published folder
// takes its permissions (it came out 0755, the staging folder's).
TEST(StagedOutputDirectoryTest, AnEmptyOutputKeepsItsPermissions) {
  ScratchDir scratch;
  const fs::path out = fs::path(scratch.path()) / "private";
  fs::create_directories(out);
  fs::permissions(out, fs::perms::owner_all);
  auto staged = StagedOutputDirectory::begin(out.string());
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  write_file(staged->path() / "a", "new");
  ASSERT_TRUE(staged->publish().ok());
  EXPECT_TRUE(fs::exists(out / "a"));
  EXPECT_EQ(fs::status(out).permissions(), fs::perms::owner_all);
}

// --out naming a link to an empty directory (on another disk, say) is written where the link
// points, and the link stays (publishing replaced it with a directory beside it); a link to
// nothing is refused.
TEST(StagedOutputDirectoryTest, ALinkToAnEmptyDirectoryIsWrittenWhereItPoints) {
  ScratchDir scratch;
  const fs::path target = fs::path(scratch.path()) / "elsewhere" / "real";
  fs::create_directories(target);
  const fs::path link = fs::path(scratch.path()) / "out";
  fs::create_directory_symlink("elsewhere/real", link);
  auto staged = StagedOutputDirectory::begin(link.string());
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  write_file(staged->path() / "a", "new");
  ASSERT_TRUE(staged->publish().ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::exists(target / "a"));

  const fs::path dangling = fs::path(scratch.path()) / "dangling";
  fs::create_directory_symlink("nowhere/model", dangling);
  const auto refused = StagedOutputDirectory::begin(dangling.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("a symbolic link to nothing"), std::string::npos)
      << refused.status().message();
}

TEST(StagedOutputDirectoryTest, AStagingFolderOfAProcessThatIsGoneIsRemoved) {
  ScratchDir scratch;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // its pid now names no process
  const fs::path out = fs::path(scratch.path()) / "model";
  const fs::path abandoned = staging_path_for(out, child);
  const fs::path other = staging_path_for(fs::path(scratch.path()) / "other", child);
  const fs::path running = staging_path_for(out, 1);  // init: alive
  // Another host's staging folder under the same process id: not judged from here.
  const fs::path elsewhere = out.string() + ".partial-another_host-" + std::to_string(child);
  for (const fs::path& p : {abandoned, other, running, elsewhere}) {
    fs::create_directories(p);
    write_file(p / "model-00001-of-00002.safetensors", "half");
  }
  auto staged = StagedOutputDirectory::begin(out.string());
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(other));    // another output's
  EXPECT_TRUE(fs::exists(running));  // its process runs
  EXPECT_TRUE(fs::exists(elsewhere));
}

// make-test-model: a non-empty output (here a trained checkpoint's files) is refused and
// untouched; it used to be overwritten file by file, leaving the old shards beside the new.
TEST(StagedOutputDirectoryTest, TestModelsAreNotWrittenOverAnotherCheckpoint) {
  ScratchDir scratch;
  write_file(scratch.file("model-00001-of-00003.safetensors"), "trained");
  write_file(scratch.file("config.json"), "{\"trained\": true}");
  TestModelOptions options;
  const Status status = write_test_model(scratch.path(), options);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  EXPECT_EQ(testing::read_file_bytes(scratch.file("config.json")), "{\"trained\": true}");
  EXPECT_EQ(std::distance(fs::directory_iterator(scratch.path()), fs::directory_iterator()), 2);
}

}  // namespace
}  // namespace peerserve
