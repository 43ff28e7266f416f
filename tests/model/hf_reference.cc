#include "tests/model/hf_reference.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "base/check.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve::testing {

nlohmann::json run_hf_reference(const nlohmann::json& request) {
  const std::string dir = make_temp_dir("hf_reference");
  const std::string input = dir + "/request.json";
  std::ofstream(input) << request.dump();
  const std::string command =
      std::string("/usr/bin/python3 ") + PEERSERVE_TEST_MODEL_DIR + "/hf_reference.py < " + input;
  FILE* pipe = popen(command.c_str(), "r");
  PS_CHECK(pipe != nullptr) << "cannot run " << command;
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, n);
  const int rc = pclose(pipe);
  PS_CHECK(rc == 0) << command << " failed with status " << rc;
  return nlohmann::json::parse(text);
}

}  // namespace peerserve::testing
