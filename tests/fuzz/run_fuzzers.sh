#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (a separate small build: the main build uses g++)
# and runs each for a bounded time. Usage: run_fuzzers.sh CLANGXX SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
clangxx=$1 src=$2 work=$3 seconds=$4
mkdir -p "$work"
cd "$work"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I "$src")
common=("$src/base/status.cc" "$src/base/check.cc" "$src/tensor/dtype.cc"
        "$src/model/checkpoint/safetensors.cc" "$src/model/checkpoint/mapped_file.cc")
"$clangxx" "${flags[@]}" -o safetensors_header_fuzzer \
  "$src/tests/fuzz/safetensors_header_fuzzer.cc" "${common[@]}"
"$clangxx" "${flags[@]}" -o model_config_fuzzer "$src/tests/fuzz/model_config_fuzzer.cc" \
  "$src/model/model_config.cc" "$src/model/checkpoint/tensor_layout.cc" "${common[@]}"

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
./safetensors_header_fuzzer -max_total_time="$seconds" -max_len=2048 -timeout=10 \
  -dict="$src/tests/fuzz/safetensors.dict" -print_final_stats=1 corpus_safetensors
./model_config_fuzzer -max_total_time=$(( seconds / 3 + 1 )) -max_len=2048 -timeout=10 \
  -print_final_stats=1 corpus_config
