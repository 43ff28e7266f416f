// generation_config.json's sampling defaults (serve/generation_defaults.h): read as vLLM's
// --generation-config auto reads them, checked as a request's fields are, and applied by the
// request parser only to the fields a request leaves out.
#include "serve/generation_defaults.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "serve/openai_protocol.h"
#include "tests/model_loading/fifo_in_place.h"

namespace peerserve {
namespace {

TEST(GenerationDefaultsTest, ReadsTheSamplingKeysOnly) {
  // DeepSeek-V3's own file, plus keys that are not read.
  auto d = parse_generation_defaults(
      R"({"_from_model_config": true, "bos_token_id": 0, "eos_token_id": 1, "do_sample": true,
          "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 7, "transformers_version": "4"})",
      "g.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->temperature, 0.6f);
  EXPECT_EQ(d->top_p, 0.95f);
  EXPECT_FALSE(d->top_k || d->min_p || d->repetition_penalty);
  EXPECT_EQ(d->eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(d->describe(), "temperature=0.6, top_p=0.95, eos_token_id=[1]");
  d = parse_generation_defaults(R"({"top_k": 20, "min_p": 0.1, "repetition_penalty": 1.1,
                                    "temperature": null})",
                                "g.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->top_k, 20);
  EXPECT_FALSE(d->temperature);
  // transformers' own default top_k (50) and an end-of-turn id listed only here.
  d = parse_generation_defaults(R"({"top_k": 50, "eos_token_id": [163585, 163586]})", "g.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_FALSE(d->top_k);
  EXPECT_EQ(d->eos_token_ids, (std::vector<int64_t>{163585, 163586}));
}

TEST(GenerationDefaultsTest, RefusesWhatNoRequestMayHaveNamingTheKeyAndFile) {
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"top_p": 2})", "top_p"},
           {R"({"temperature": -1})", "temperature"},
           {R"({"temperature": "0.6"})", "temperature"},
           {R"({"top_k": 1.5})", "top_k"},
           {R"({"top_k": -2})", "top_k"},
           {R"({"repetition_penalty": 0})", "repetition_penalty"},
           {R"({"min_p": 3})", "min_p"},
           {R"({"eos_token_id": [-1]})", "eos_token_id"},
           {R"({"eos_token_id": []})", "eos_token_id"},
           {R"([1])", "JSON object"},
           {R"({"temperature": 0.6)", "JSON object"},
       }) {
    const Status s = parse_generation_defaults(text, "dir/generation_config.json").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("dir/generation_config.json"), std::string::npos) << s.message();
  }
  // Nesting is bounded before anything walks it.
  const std::string deep = R"({"x": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_FALSE(parse_generation_defaults(deep, "g.json").ok());
}

TEST(GenerationDefaultsTest, AbsentFileMeansNoDefaults) {
  const auto dir = std::filesystem::temp_directory_path() / "generation_defaults_test";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "generation_config.json");
  auto d = load_generation_defaults(dir.string());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty());
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 0.3})";
  d = load_generation_defaults(dir.string());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->temperature, 0.3f);
  // Larger than any generation config, or not a regular file: an error naming the file.
  std::ofstream(dir / "generation_config.json") << std::string((1 << 20) + 1, ' ');
  Status s = load_generation_defaults(dir.string()).status();
  EXPECT_NE(s.message().find("generation_config.json: 1048577 bytes, more than"), std::string::npos)
      << s.message();
  const std::string fifo = (dir / "generation_config.json").string();
  ASSERT_TRUE(testing::replace_with_fifo(fifo));
  s = testing::load_beside_fifo(fifo,
                                [&] { return load_generation_defaults(dir.string()).status(); });
  EXPECT_NE(s.message().find("generation_config.json: a FIFO, expected a regular file"),
            std::string::npos)
      << s.message();
  std::filesystem::remove_all(dir);
}

TEST(GenerationDefaultsTest, RequestsThatLeaveAFieldOutGetTheDefault) {
  ApiLimits limits;
  limits.sampling_defaults.temperature = 0.6f;
  limits.sampling_defaults.top_p = 0.95f;
  CompletionRequest left_out, given;
  ASSERT_FALSE(
      parse_completion_request(nlohmann::json::parse(R"({"prompt": "x"})"), limits, &left_out));
  EXPECT_EQ(left_out.params.sampling.temperature, 0.6f);
  EXPECT_EQ(left_out.params.sampling.top_p, 0.95f);
  ASSERT_FALSE(parse_completion_request(
      nlohmann::json::parse(R"({"prompt": "x", "temperature": 1.0, "top_p": 1})"), limits, &given));
  EXPECT_EQ(given.params.sampling.temperature, 1.0f);
  EXPECT_EQ(given.params.sampling.top_p, 1.0f);
  ChatRequest chat;
  ASSERT_FALSE(parse_chat_request(
      nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), limits,
      &chat));
  EXPECT_EQ(chat.params.sampling.temperature, 0.6f);
}

}  // namespace
}  // namespace peerserve
