// Independent reference for the trained tokenizer: loads tokenizer.json and
// tokenizer_config.json with @lenml/tokenizers (a port of transformers.js, installed by
// scripts/install-test-js.sh) and writes, for each input text, the token ids (without BOS:
// transformers.js adds none here, so add_bos_token is not checked against it),
// the pre-tokenizer pieces, the decoded text, and the chat template rendering.
//
//   node js_tokenizer_reference.js MODEL_DIR INPUT.json OUTPUT.json
//
// INPUT.json: {"texts": [...], "chats": [[{"role": ..., "content": ...}, ...], ...]}
"use strict";
const fs = require("fs");
const path = require("path");

const repoRoot = path.resolve(__dirname, "..", "..");
const { TokenizerLoader } = require(
    path.join(repoRoot, "tests", "js", "node_modules", "@lenml", "tokenizers"));

const [modelDir, inputPath, outputPath] = process.argv.slice(2);
if (!outputPath) {
  console.error("usage: node js_tokenizer_reference.js MODEL_DIR INPUT.json OUTPUT.json");
  process.exit(2);
}
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: readJson(path.join(modelDir, "tokenizer.json")),
  tokenizerConfig: readJson(path.join(modelDir, "tokenizer_config.json")),
});
const input = readJson(inputPath);
const out = {texts: [], chats: []};
for (const text of input.texts) {
  const ids = tokenizer.encode(text);
  out.texts.push({
    ids: Array.from(ids),
    pieces: tokenizer.pre_tokenizer.pre_tokenize(text),
    decoded: ids.length ? tokenizer.decode(ids, {skip_special_tokens: true}) : "",
  });
}
for (const chat of input.chats || []) {
  const rendered = tokenizer.apply_chat_template(
      chat, {tokenize: false, add_generation_prompt: true});
  const ids = tokenizer.apply_chat_template(
      chat, {tokenize: true, add_generation_prompt: true, return_tensor: false});
  out.chats.push({rendered, ids: Array.from(ids)});
}
fs.writeFileSync(outputPath, JSON.stringify(out));
