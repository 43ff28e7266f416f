// peerserve tokenize: the model's tokenizer on the command line. Needs only the tokenizer
// files of the model folder (tokenizer.json, tokenizer_config.json).
//
//   peerserve tokenize --model DIR --text "Hello"          -> 0,19923
//   peerserve tokenize --model DIR --file prompt.txt --no-special
//   peerserve tokenize --model DIR --decode 0,19923        -> <｜begin▁of▁sentence｜>Hello
//   peerserve tokenize --model DIR --chat messages.json --generation-prompt [--render]
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/command_registry.h"
#include "apps/token_id_list.h"
#include "base/regular_file.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct TokenizeCli {
  std::string model_dir;
  std::string text;
  std::string file;
  std::string decode;
  std::string chat_file;
  bool no_special = false;
  bool skip_special = false;
  bool generation_prompt = false;
  bool render = false;
  bool show_tokens = false;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return kExitFailure;
}

// --file and --chat: a regular file of at most 1 GiB (/dev/zero read until memory ran out, a
// directory read as empty text).
Result<std::string> read_text_file(const std::string& path) {
  return read_regular_file(path, uint64_t{1} << 30);
}

// The text as it is, NUL bytes included (printf's %s stopped at the first).
void print_text(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

void print_ids(const Tokenizer& tokenizer, const std::vector<TokenId>& ids, bool show_tokens) {
  if (show_tokens) {
    for (TokenId id : ids) {
      std::printf("%d\t%s\n", id,
                  nlohmann::json(std::string(tokenizer.token_text(id))).dump().c_str());
    }
    return;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
}

int run_tokenize(const TokenizeCli& cli) {
  const int inputs =
      !cli.text.empty() + !cli.file.empty() + !cli.decode.empty() + !cli.chat_file.empty();
  if (inputs != 1) {
    return fail(
        "give exactly one of --text, --file, --decode, --chat (an empty value counts as "
        "none)");
  }
  auto tokenizer = Tokenizer::load_from_dir(cli.model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status().message());

  if (!cli.decode.empty()) {
    auto ids = parse_token_id_list("--decode", cli.decode);
    if (!ids.ok()) return fail(ids.status().message());
    auto text = tokenizer->decode(*ids, {.skip_special_tokens = cli.skip_special});
    if (!text.ok()) return fail(text.status().message());
    print_text(*text);
    return 0;
  }
  if (!cli.chat_file.empty()) {
    auto source = read_text_file(cli.chat_file);
    if (!source.ok()) return fail(source.status().message());
    ChatTemplateInput input;
    input.messages = nlohmann::json::parse(*source, nullptr, /*allow_exceptions=*/false);
    if (input.messages.is_discarded() || !input.messages.is_array()) {
      return fail(cli.chat_file + ": expected a JSON array of messages");
    }
    input.add_generation_prompt = cli.generation_prompt;
    if (cli.render) {
      auto text = tokenizer->apply_chat_template(input);
      if (!text.ok()) return fail(text.status().message());
      print_text(*text);
      return 0;
    }
    auto ids = tokenizer->encode_chat(input);
    if (!ids.ok()) return fail(ids.status().message());
    print_ids(*tokenizer, *ids, cli.show_tokens);
    return 0;
  }
  std::string text = cli.text;
  if (!cli.file.empty()) {
    auto contents = read_text_file(cli.file);
    if (!contents.ok()) return fail(contents.status().message());
    text = std::move(*contents);
  }
  auto ids = tokenizer->encode(text, {.add_special_tokens = !cli.no_special});
  if (!ids.ok()) return fail(ids.status().message());
  print_ids(*tokenizer, *ids, cli.show_tokens);
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* sub = root.add_subcommand("tokenize", "Encode text to token ids or decode ids to text");
  auto cli = std::make_shared<TokenizeCli>();
  sub->add_option("--model", cli->model_dir, "Model folder with tokenizer.json")->required();
  sub->add_option("--text", cli->text, "Text to encode");
  sub->add_option("--file", cli->file, "File whose contents to encode");
  CLI::Option* decode =
      sub->add_option("--decode", cli->decode, "Comma-separated token ids to decode");
  CLI::Option* chat =
      sub->add_option("--chat", cli->chat_file,
                      "JSON file with an array of chat messages to render with the chat template");
  // Flags for one kind of input are refused with another (they would be ignored).
  sub->add_flag("--no-special", cli->no_special,
                "With --text or --file: do not add BOS/EOS when encoding")
      ->excludes(decode)
      ->excludes(chat);
  sub->add_flag("--skip-special", cli->skip_special, "With --decode: drop special tokens")
      ->needs(decode);
  sub->add_flag("--generation-prompt", cli->generation_prompt,
                "With --chat: end with the assistant prompt (add_generation_prompt)")
      ->needs(chat);
  auto* render =
      sub->add_flag("--render", cli->render, "With --chat: print the rendered text, not ids")
          ->needs(chat);
  sub->add_flag("--show-tokens", cli->show_tokens,
                "When encoding: print one 'id<TAB>token' line per token")
      ->excludes(decode)
      ->excludes(render);  // the rendered text has no ids to show
  sub->callback([cli] { set_command_exit_code(run_tokenize(*cli)); });
});

}  // namespace
}  // namespace peerserve
