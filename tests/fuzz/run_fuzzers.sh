#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (a separate small build: the main build uses g++)
# and runs each for a bounded time: the checkpoint header and config parsers, and the
# parsers of untrusted text (chat template, tokenizer.json, OpenAI request bodies,
# encode/decode, tool calls in model output), the cache server's block-stream requests, and
# the data-parallel front end's engine requests and outputs between ranks. Seeds:
# tests/fuzz/corpus/<target>/ (each past finding is one) plus the inputs generated below.
# Usage: run_fuzzers.sh CLANGXX SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
clangxx=$1 src=$2 work=$3 seconds=$4
mkdir -p "$work"
cd "$work"
# Line tables are all a crash report needs (full debug info made the compiles ~25% slower).
flags=(-std=c++20 -O1 -gline-tables-only -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I "$src")
# Every compile runs as a background job, at most nproc at once: one after another they were
# most of this test's time, which ctest cannot overlap with the serial tests.
pids=()
max_jobs=$(nproc)
spawn() {
  "$@" &
  pids+=($!)
  if (( ${#pids[@]} >= max_jobs )); then
    wait "${pids[0]}"  # set -e: a failed compile stops the script
    pids=("${pids[@]:1}")
  fi
}
wait_all() {
  for pid in "${pids[@]}"; do wait "$pid"; done
  pids=()
}
common=("$src/base/status.cc" "$src/base/check.cc" "$src/base/regular_file.cc" "$src/tensor/dtype.cc"
        "$src/model/checkpoint/safetensors.cc" "$src/model/checkpoint/mapped_file.cc")
spawn "$clangxx" "${flags[@]}" -o safetensors_header_fuzzer \
  "$src/tests/fuzz/safetensors_header_fuzzer.cc" "${common[@]}"
spawn "$clangxx" "${flags[@]}" -o model_config_fuzzer "$src/tests/fuzz/model_config_fuzzer.cc" \
  "$src/model/model_config.cc" "$src/model/checkpoint/tensor_layout.cc" \
  "$src/model/rotary_embedding.cc" "${common[@]}"
spawn "$clangxx" "${flags[@]}" -o block_stream_protocol_fuzzer \
  "$src/tests/fuzz/block_stream_protocol_fuzzer.cc" "$src/cache/block_stream_protocol.cc" \
  "$src/base/status.cc" "$src/base/check.cc"
spawn "$clangxx" "${flags[@]}" -o request_codec_fuzzer "$src/tests/fuzz/request_codec_fuzzer.cc" \
  "$src/runtime/request_codec.cc" "$src/base/status.cc" "$src/base/check.cc"

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
# The tokenizer layer (and the request parser above it) once, as objects shared by the four
# text fuzzers.
mkdir -p objects
text_sources=("$src"/tokenizer/*.cc "$src"/tokenizer/internal/*.cc "$src"/tokenizer/jinja/*.cc
              "$src/serve/openai_protocol.cc" "$src/serve/tool_call_parser.cc"
              "$src/kv/kv_namespace.cc" "$src/kv/kv_layout.cc" "$src/kv/prefix_hash.cc"
              "$src/tensor/dtype.cc" "$src/base/status.cc" "$src/base/check.cc"
              "$src/base/regular_file.cc")
objects=()
for source in "${text_sources[@]}"; do
  object="objects/$(echo "${source#"$src"/}" | tr / _).o"
  spawn "$clangxx" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" \
    -DPEERSERVE_SOURCE_DIR="\"$src\"" -c "$source" -o "$object"
  objects+=("$object")
done
wait_all  # the text fuzzers link these objects
for target in chat_template tokenizer_json openai_request encode_decode tool_call_parser; do
  spawn "$clangxx" "${flags[@]}" -DPEERSERVE_SOURCE_DIR="\"$src\"" -o "${target}_fuzzer" \
    "$src/tests/fuzz/${target}_fuzzer.cc" "$src/tests/fuzz/finish_reason_for_fuzzing.cc" \
    "${objects[@]}" -lpcre2-8 -lcrypto  # libcrypto: kv/prefix_hash.cc's SHA-256
done
wait_all

# Committed seeds, plus the large regression inputs (generated, not committed).
for target in chat_template tokenizer_json openai_request encode_decode tool_call_parser; do
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
./chat_template_fuzzer "${text_run[@]}" -max_len=1048576 -dict="$src/tests/fuzz/jinja.dict" \
  corpus_chat_template
./tokenizer_json_fuzzer "${text_run[@]}" -max_len=262144 \
  -dict="$src/tests/fuzz/tokenizer_json.dict" corpus_tokenizer_json
./openai_request_fuzzer "${text_run[@]}" -max_len=1048576 \
  -dict="$src/tests/fuzz/openai_request.dict" corpus_openai_request
./encode_decode_fuzzer "${text_run[@]}" -max_len=4096 corpus_encode_decode
./tool_call_parser_fuzzer "${text_run[@]}" -max_len=65536 -dict="$src/tests/fuzz/tool_call.dict" \
  corpus_tool_call_parser

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
./block_stream_protocol_fuzzer -max_total_time=$(( seconds / 3 + 1 )) -max_len=4096 -timeout=10 \
  -print_final_stats=1 corpus_block_stream
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
sampling = (f32(0.7) + i32(40) + f32(0.9) + f32(0.0) + f32(0.1) + f32(0.2) + f32(1.1) +
            b(True) + u64(1234) + b(True) + i32(3) + i32(2) + arr([1]) + arr([5, 6]))
request = (arr([1, 2, 3, 4]) + sampling + b(True) + i32(16) + u64(2) + s("\n\n") + s("END") +
           b(False) + arr([7]) + b(False) + i32(2) + b(True) + s("127.0.0.1:9000"))
open(f"{d}/request", "wb").write(b"\x00" + request)
choice = (i32(0) + arr([5, 6]) + s("hi") + u64(2) +
          i32(5) + f32(-0.5) + u64(1) + i32(5) + f32(-0.5) +
          i32(6) + f32(-1.5) + u64(0) +
          b(True) + i32(0) + b(True) + s("END") + b(False))
output = (u64(42) + u64(1) + choice + b(True) + struct.pack("<qqq", 4, 2, 0) + i32(0) + s(""))
open(f"{d}/output", "wb").write(b"\x01" + output)
error = (u64(43) + u64(0) + b(True) + struct.pack("<qqq", 4, 0, 0) + i32(8) + s("peer down"))
open(f"{d}/output_error", "wb").write(b"\x01" + error)
PY
./request_codec_fuzzer -max_total_time=$(( seconds / 3 + 1 )) -max_len=4096 -timeout=10 \
  -print_final_stats=1 corpus_request_codec
./safetensors_header_fuzzer -max_total_time="$seconds" -max_len=2048 -timeout=10 \
  -dict="$src/tests/fuzz/safetensors.dict" -print_final_stats=1 corpus_safetensors
./model_config_fuzzer -max_total_time=$(( seconds / 3 + 1 )) -max_len=2048 -timeout=10 \
  -print_final_stats=1 corpus_config
