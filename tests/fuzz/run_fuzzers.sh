#!/usr/bin/env bash
# Runs each libFuzzer target that tests/fuzz/CMakeLists.txt builds for a bounded time: the
# checkpoint header and config parsers, and the parsers of untrusted text (chat template,
# tokenizer.json, OpenAI request bodies, encode/decode, tool calls in model output,
# structured-output patterns and schemas), the cache
# server's block-stream requests, and the data-parallel front end's engine requests and
# outputs between ranks. Seeds: tests/fuzz/corpus/<target>/ (each past finding is one) plus
# the inputs generated below.
# Usage: run_fuzzers.sh FUZZER_DIR SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
bin=$1 src=$2 work=$3 seconds=$4
mkdir -p "$work"
cd "$work"

# Seeds: a valid two-tensor file and a valid config.
rm -rf corpus_safetensors corpus_config
mkdir -p corpus_safetensors corpus_config
/usr/bin/python3 - <<'PY'
import json, struct
h = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]},
                "__metadata__": {"format": "pt"}}).encode()
open("corpus_safetensors/valid", "wb").write(struct.pack("<Q", len(h)) + h + bytes(12))
cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
       "vocab_size": 64, "hidden_size": 8, "intermediate_size": 16, "moe_intermediate_size": 4,
       "num_hidden_layers": 2, "num_attention_heads": 2, "kv_lora_rank": 4,
       "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "q_lora_rank": 4,
       "n_routed_experts": 4, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
       "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
       "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64},
       "quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 4]}}
open("corpus_config/valid", "w").write(json.dumps(cfg))
PY
# Committed seeds, plus the large regression inputs (generated, not committed).
for target in chat_template tokenizer_json openai_request encode_decode tool_call_parser \
  structured_output; do
  rm -rf "corpus_$target"
  mkdir -p "corpus_$target"
  cp "$src/tests/fuzz/corpus/$target/"* "corpus_$target/"
done
cp "$src/models/peerserve-dsv3-tiny/tokenizer.json" corpus_tokenizer_json/shipped
/usr/bin/python3 - <<'PY'
deep = 300000
open("corpus_openai_request/deep_tools", "w").write(
    '{"messages": [{"role": "user", "content": "x"}], "tools": ' + "[" * deep + "]" * deep + "}")
open("corpus_chat_template/deep_plus", "w").write("{{ 1" + " + 1" * 2500 + " }}")
open("corpus_chat_template/deep_if", "w").write("{% if x %}" * 2000 + "{% endif %}" * 2000)
open("corpus_chat_template/deep_attributes", "w").write("{{ x" + ".a" * 5000 + " }}")
open("corpus_tokenizer_json/deep_decoder", "w").write(
    '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": ' +
    '{"type": "Sequence", "decoders": [' * 20000 + "{}" + "]}" * 20000 + "}")
PY
text_run=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1)
"$bin/chat_template_fuzzer" "${text_run[@]}" -max_len=1048576 -dict="$src/tests/fuzz/jinja.dict" \
  corpus_chat_template
"$bin/tokenizer_json_fuzzer" "${text_run[@]}" -max_len=262144 \
  -dict="$src/tests/fuzz/tokenizer_json.dict" corpus_tokenizer_json
"$bin/openai_request_fuzzer" "${text_run[@]}" -max_len=1048576 \
  -dict="$src/tests/fuzz/openai_request.dict" corpus_openai_request
"$bin/encode_decode_fuzzer" "${text_run[@]}" -max_len=4096 corpus_encode_decode
"$bin/tool_call_parser_fuzzer" "${text_run[@]}" -max_len=65536 \
  -dict="$src/tests/fuzz/tool_call.dict" corpus_tool_call_parser
"$bin/structured_output_fuzzer" "${text_run[@]}" -max_len=4096 \
  -dict="$src/tests/fuzz/structured_output.dict" corpus_structured_output

rm -rf corpus_block_stream
mkdir -p corpus_block_stream
/usr/bin/python3 - <<'PY'
import struct
def request(op, keys):
    table = b""
    for tenant, h, size in keys:
        table += bytes([len(tenant)]) + tenant + struct.pack("<Q", h)
        if op == 2:
            table += struct.pack("<Q", size)
    return struct.pack("<IB3xII", 0x31425350, op, len(keys), len(table)) + table
open("corpus_block_stream/get", "wb").write(request(1, [(b"kv", 1, 0), (b"tenant-b", 2**63, 0)]))
open("corpus_block_stream/put", "wb").write(request(2, [(b"kv", 7, 46080)]))
PY
"$bin/block_stream_protocol_fuzzer" -max_total_time=$(( seconds / 3 + 1 )) -max_len=4096 \
  -timeout=10 -print_final_stats=1 corpus_block_stream
# Seeds: an engine request and two engine outputs (first byte 0: request, 1: output).
rm -rf corpus_request_codec
mkdir -p corpus_request_codec
/usr/bin/python3 - <<'PY'
import struct
d = "corpus_request_codec"
def u64(n): return struct.pack("<Q", n)
def i32(n): return struct.pack("<i", n)
def f32(x): return struct.pack("<f", x)
def b(v): return bytes([1 if v else 0])
def arr(xs): return u64(len(xs)) + b"".join(i32(x) for x in xs)
def s(t): t = t.encode(); return u64(len(t)) + t
# Field for field as runtime/request_codec.cc writes them.
sampling = (f32(0.7) + i32(40) + f32(0.9) + f32(0.0) + f32(0.1) + f32(0.2) + f32(1.1) +
            b(True) + u64(1234) + b(True) + i32(3) + i32(2) + arr([1]) + arr([5, 6]) +
            arr([5, 9, 11]) + u64(1) + i32(9) + f32(-1.5) + u64(2) + arr([7]) + arr([3, 4]))
request = (arr([1, 2, 3, 4]) + sampling + b(True) + i32(16) + b(False) + u64(2) + s("\n\n") +
           s("END") + b(False) + arr([7]) + b(False) + i32(2) + b(True) + b(True) + i32(3) +
           s("[0-9]+") + s("127.0.0.1:9000") + s("salt") + b(False))
open(f"{d}/request", "wb").write(b"\x00" + request)
choice = (i32(0) + arr([5, 6]) + s("hi") + u64(2) +
          i32(5) + f32(-0.5) + u64(1) + i32(5) + f32(-0.5) +
          i32(6) + f32(-1.5) + u64(0) +
          b(True) + i32(0) + b(True) + s("END") + b(False))
prompt_logprobs = (u64(2) + i32(5) + f32(-0.7) + i32(1) + u64(1) + i32(5) + f32(-0.7) +
                   i32(6) + f32(-2.0) + i32(3) + u64(0))
output = (u64(42) + u64(1) + choice + prompt_logprobs + b(True) + struct.pack("<qqq", 4, 2, 0) +
          i32(0) + s(""))
open(f"{d}/output", "wb").write(b"\x01" + output)
error = (u64(43) + u64(0) + u64(0) + b(True) + struct.pack("<qqq", 4, 0, 0) + i32(8) +
         s("peer down"))
open(f"{d}/output_error", "wb").write(b"\x01" + error)
PY
"$bin/request_codec_fuzzer" -max_total_time=$(( seconds / 3 + 1 )) -max_len=4096 -timeout=10 \
  -print_final_stats=1 corpus_request_codec
"$bin/safetensors_header_fuzzer" -max_total_time="$seconds" -max_len=2048 -timeout=10 \
  -dict="$src/tests/fuzz/safetensors.dict" -print_final_stats=1 corpus_safetensors
"$bin/model_config_fuzzer" -max_total_time=$(( seconds / 3 + 1 )) -max_len=2048 -timeout=10 \
  -print_final_stats=1 corpus_config
