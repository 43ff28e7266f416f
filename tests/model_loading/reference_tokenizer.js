// Loads a generated tokenizer.json + tokenizer_config.json with the npm tokenizer library
// (an independent implementation of Hugging Face tokenizers) and prints what it makes of them.
// Usage: node reference_tokenizer.js NODE_MODULES_DIR CHECKPOINT_DIR
const path = require("path");
const fs = require("fs");
const { TokenizerLoader } = require(path.resolve(process.argv[2], "@lenml/tokenizers"));

const dir = process.argv[3];
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const text = "Hello world, the cat is in the house! 123 données ünïcode 你好";
const ids = tokenizer.encode(text);
const chat = tokenizer.apply_chat_template(
  [{ role: "user", content: "Hi there" }],
  { tokenize: false, add_generation_prompt: true });
const chatIds = tokenizer.encode(chat, { add_special_tokens: false });
console.log(JSON.stringify({
  ids,
  decoded: tokenizer.decode(ids, { skip_special_tokens: true }),
  chat,
  chat_ids: chatIds,
  user_id: tokenizer.model.tokens_to_ids.get("<｜User｜>"),
  assistant_id: tokenizer.model.tokens_to_ids.get("<｜Assistant｜>"),
}));
