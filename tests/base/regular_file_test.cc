#include "base/regular_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/model_loading/fifo_in_place.h"

namespace peerserve {
namespace {

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("peerserve_regular_file_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(RegularFileTest, ReadsAWholeFileWithItsNulBytes) {
  const std::string text = std::string("{\"a\": 1}\n") + std::string(1, '\0') + "tail";
  const std::string path = write("f.json", text);
  Result<std::string> got = read_regular_file(path, text.size());
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, text);
  EXPECT_EQ(read_regular_file(write("empty", ""), 0).value(), "");
}

TEST_F(RegularFileTest, RefusesWhatIsNotARegularFileOrIsTooLarge) {
  const Status missing = read_regular_file(dir_ / "missing", 100).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.message(), "missing: cannot open")) << missing.message();

  const Status directory = read_regular_file(dir_, 100).status();
  EXPECT_EQ(directory.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(directory.message(), ": a directory, expected a regular file"))
      << directory.message();

  const Status large = read_regular_file(write("big", std::string(101, 'x')), 100).status();
  EXPECT_EQ(large.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(large.message(), "101 bytes, more than the 100")) << large.message();

  const Status device = read_regular_file("/dev/zero", 100).status();
  EXPECT_TRUE(contains(device.message(), ": a device, expected a regular file"))
      << device.message();
}

// A file of /proc says 0 bytes in stat and has more: read to its end (it read as empty).
TEST_F(RegularFileTest, AFileLongerThanItsStatedSizeIsReadToItsEnd) {
  Result<std::string> status = read_regular_file("/proc/self/status", 1 << 20);
  ASSERT_TRUE(status.ok()) << status.status().to_string();
  EXPECT_TRUE(contains(*status, "Name:")) << *status;
  const Status small = read_regular_file("/proc/self/status", 8).status();
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument) << small.to_string();
  EXPECT_TRUE(contains(small.message(), "more than the 8 bytes")) << small.message();
}

TEST_F(RegularFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = (dir_ / "config.json").string();
  ASSERT_TRUE(testing::replace_with_fifo(fifo));
  const Status s =
      testing::load_beside_fifo(fifo, [&] { return read_regular_file(fifo, 100).status(); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(contains(s.message(), ": a FIFO, expected a regular file")) << s.message();
}

TEST_F(RegularFileTest, TextFromAFileOrAPipeUpToALimit) {
  const std::string path = write("t.txt", std::string(70000, 'a') + "tail");
  Result<TextPrefix> whole = read_text_file_or_pipe(path, "--text t.txt", 70004);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(whole->text.size(), 70004u);
  EXPECT_FALSE(whole->more);
  Result<TextPrefix> cut = read_text_file_or_pipe(path, "--text t.txt", 70003);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->text, std::string(70000, 'a') + "tai");
  EXPECT_TRUE(cut->more);
  Result<TextPrefix> none = read_text_file_or_pipe(path, "--text t.txt", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->text, "");
  EXPECT_TRUE(none->more);

  // A pipe, as a shell's <(...) gives: read while its writer writes.
  const std::string fifo = (dir_ / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << std::string(100000, 'p'); });
  Result<TextPrefix> piped = read_text_file_or_pipe(fifo, "--text pipe", 1 << 20);
  writer.join();
  ASSERT_TRUE(piped.ok()) << piped.status().to_string();
  EXPECT_EQ(piped->text, std::string(100000, 'p'));
  EXPECT_FALSE(piped->more);
}

TEST_F(RegularFileTest, TextFromADirectoryOrADeviceIsRefused) {
  const Status directory = read_text_file_or_pipe(dir_, "--chat-template d", 100).status();
  EXPECT_EQ(directory.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(directory.message(),
            "--chat-template d: expected a file or a pipe (a directory or a device is neither)");
  const Status device = read_text_file_or_pipe("/dev/zero", "--calib /dev/zero", 100).status();
  EXPECT_EQ(device.code(), StatusCode::kInvalidArgument);
  const Status missing = read_text_file_or_pipe(dir_ / "missing", "--calib m", 100).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.message(), "--calib m: No such file")) << missing.message();
}

}  // namespace
}  // namespace peerserve
