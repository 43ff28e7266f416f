#include "base/output_file_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace peerserve {
namespace {

namespace fs = std::filesystem;

class OutputFileCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("peerserve_output_check_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(OutputFileCheckTest, AFileThatCanBeWrittenPasses) {
  EXPECT_TRUE(check_output_file("--out", (dir_ / "new.json").string()).ok());
  std::ofstream(dir_ / "old.json") << "{}";
  EXPECT_TRUE(check_output_file("--out", (dir_ / "old.json").string()).ok());
  // A link to a file not made yet, in a folder that exists: written there.
  fs::create_symlink("new.json", dir_ / "link.json");
  EXPECT_TRUE(check_output_file("--out", (dir_ / "link.json").string()).ok());
}

TEST_F(OutputFileCheckTest, WhatCannotBeWrittenIsRefusedBeforeTheWork) {
  const Status directory = check_output_file("--out", dir_.string());
  EXPECT_NE(directory.message().find("a directory"), std::string::npos) << directory.message();
  const Status no_folder = check_output_file("--out", (dir_ / "missing" / "x.json").string());
  EXPECT_EQ(no_folder.code(), StatusCode::kNotFound) << no_folder.to_string();
  // A link into a folder that does not exist (it passed: the link's own folder was checked,
  // and the write at the end of the command failed).
  fs::create_symlink("missing/x.json", dir_ / "dangling.json");
  const Status dangling = check_output_file("--out", (dir_ / "dangling.json").string());
  EXPECT_EQ(dangling.code(), StatusCode::kNotFound) << dangling.to_string();
  EXPECT_NE(dangling.message().find("no folder"), std::string::npos) << dangling.message();
  // A chain of two links into a missing folder (one hop was followed).
  fs::create_symlink("dangling.json", dir_ / "chain.json");
  EXPECT_EQ(check_output_file("--out", (dir_ / "chain.json").string()).code(),
            StatusCode::kNotFound);
  // A loop of links.
  fs::create_symlink("loop_b", dir_ / "loop_a");
  fs::create_symlink("loop_a", dir_ / "loop_b");
  const Status loop = check_output_file("--out", (dir_ / "loop_a").string());
  EXPECT_NE(loop.message().find("too many symbolic links"), std::string::npos) << loop.message();
}

}  // namespace
}  // namespace peerserve
