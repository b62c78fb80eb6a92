#!/usr/bin/env bash
# Runs the libFuzzer targets (clang, ASan + UBSan) for SECONDS each (default 30): the
# safetensors parser, seeded with the shared sample files when present, the Parquet reader,
# seeded with small files pyarrow writes when it is installed, and the Jinja interpreter of
# chat templates, seeded with the shared Llama 3 template and a few of ours.
# Exits non-zero when a fuzzer finds a crash, a sanitizer error, a hang or an unexpected
# exception (the input is saved under build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
mkdir -p build-fuzz/corpus
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
  tests/io/fuzz/safetensors_fuzz.cpp src/io/safetensors.cpp src/io/checksum.cpp src/core/error.cpp src/core/dtype.cpp \
  src/core/tensor.cpp src/core/allocator.cpp src/core/mapped_file.cpp -o build-fuzz/safetensors_fuzz
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
  tests/io/fuzz/parquet_fuzz.cpp src/io/parquet.cpp src/io/parquet_meta.cpp src/io/parquet_pages.cpp \
  src/io/decompress.cpp src/core/error.cpp src/core/mapped_file.cpp -lzstd -lz -o build-fuzz/parquet_fuzz
mkdir -p build-fuzz/parquet_corpus
if python3 -c 'import pyarrow' 2>/dev/null; then
  python3 tests/io/make_parquet_cases.py --seeds build-fuzz/parquet_corpus
fi
if [ -d ../shared/data/safetensors_samples ]; then cp ../shared/data/safetensors_samples/*.safetensors build-fuzz/corpus/; fi
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
  tests/data/fuzz/jinja_fuzz.cpp src/data/jinja_parse.cpp src/data/jinja_render.cpp src/data/jinja_builtins.cpp \
  src/data/jinja_value.cpp src/data/chat_template.cpp src/core/error.cpp -o build-fuzz/jinja_fuzz
mkdir -p build-fuzz/jinja_corpus
printf '%s' "{% for m in messages %}{{ '<|' ~ m.role ~ '|>' }}{{ m.content | trim }}{% endfor %}" \
  > build-fuzz/jinja_corpus/loop.jinja
printf '%s' "{%- set ns = namespace(n=0) -%}{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{{ f(ns.n + 1) }}\
{{ messages[1:] | map(attribute='role') | join(',') }}{{ {'a': [1, 2.5, none]} | tojson(indent=2) }}\
{% if messages[0].content is string and 'x' not in bos_token %}{{ messages[-1]['content'][::-1] }}{% endif %}" \
  > build-fuzz/jinja_corpus/expressions.jinja
if [ -f ../shared/data/tokenizers/llama3/tokenizer_config.json ]; then
  python3 -c 'import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))["chat_template"])' \
    ../shared/data/tokenizers/llama3/tokenizer_config.json > build-fuzz/jinja_corpus/llama3.jinja
fi
cd build-fuzz
# each run's whole log goes to build-fuzz/NAME.log; its end, where a finding's stack and saved
# input are named, is printed
run() {
  local name="$1"
  shift
  if ! "./$name" -max_total_time="$seconds" -print_final_stats=1 "$@" > "$name.log" 2>&1; then
    grep -E "^(==[0-9]+==ERROR|SUMMARY|artifact_prefix|Test unit written)|#[0-9]+ 0x.* in shardtrain" "$name.log" | head -40
    echo "fuzz.sh: $name found a problem; its log is build-fuzz/$name.log"
    return 1
  fi
  tail -6 "$name.log"
}
run safetensors_fuzz -max_len=4096 corpus
run parquet_fuzz -max_len=16384 parquet_corpus
# renders are bounded (16 MiB of text, a million loop iterations), but a render that reaches
# the bounds takes ~0.5 s in a release build and ~30x that under the sanitizers: a hang is
# what runs past 30 s
run jinja_fuzz -max_len=2048 -timeout=30 jinja_corpus
