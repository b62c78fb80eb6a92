#!/usr/bin/env bash
# `shardtrain tokenize` over a folder of 8 gzipped JSONL shards (48 MB of rows each, a corpus's
# lines), one file at a time against 4 and 8 at once, on every core; the token files must be
# equal. The tool's own summary gives each run's seconds.
# Usage: bench/data/tokenize_files_bench.sh BIN_DIR TOKENIZER_JSON CORPUS_TXT
set -euo pipefail
B=${1:?folder of the shardtrain binary}; TOK=${2:?tokenizer.json}; CORPUS=${3:?corpus.txt}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
mkdir -p "$D/in"
python3 - "$CORPUS" "$D/in" <<'PY'
import json, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
for f in range(8):
    with open(f"{sys.argv[2]}/part-{f:02d}.jsonl", "w") as out:
        n, i = 0, f * 97
        while n < 48 << 20:
            row = json.dumps({"text": lines[i % len(lines)]}) + "\n"
            out.write(row)
            n += len(row)
            i += 1
PY
gzip -1 "$D"/in/*.jsonl
echo "$(du -sh "$D/in" | cut -f1) of gzipped shards, $(nproc) threads"
for f in 1 4 8; do
  echo "--files $f: $(OMP_NUM_THREADS=$(nproc) "$B/shardtrain" tokenize --tokenizer "$TOK" --files $f "$D/in" \
      "$D/out$f" 2>&1 | tail -1)"
done
for x in "$D"/out1/*.tok; do
  cmp "$x" "$D/out4/$(basename "$x")"
  cmp "$x" "$D/out8/$(basename "$x")"
done
echo "token files equal"
