"""Writes Parquet files with pyarrow (and, where installed, with polars and DuckDB, whose writers
are their own), each beside the rows pyarrow reads back from it as JSON: the reference
parquet_test compares shardtrain's reader with.

Usage: make_parquet_cases.py OUT_DIR
       make_parquet_cases.py --seeds OUT_DIR   (small files only: the fuzz target's seeds)

Each case is OUT_DIR/<name>.parquet and OUT_DIR/<name>.json (a list of row objects). The cases
cover every codec pyarrow writes that shardtrain reads, data pages v1 and v2, dictionary and
plain pages, the delta and byte-stream-split encodings, many pages and row groups, nulls at
every level, and nested lists, structs and maps.
"""
import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def texts(rng, n, nulls=True):
    words = ["alpha", "beta", "gamma", "delta", "ünïcode", "日本語", "emoji 🙂", "", "a\nnew line", "tab\there"]
    out = []
    for i in range(n):
        if nulls and i % 7 == 3:
            out.append(None)
        else:
            k = rng.randrange(0, 30)
            out.append(" ".join(rng.choice(words) for _ in range(k)))
    return out


def flat_table(rng, n):
    return pa.table({
        "text": pa.array(texts(rng, n), pa.string()),
        "id": pa.array([None if i % 11 == 5 else i * 1_000_003 - 7 for i in range(n)], pa.int64()),
        "small": pa.array([(i * 37) % 200 - 100 for i in range(n)], pa.int32()),
        "score": pa.array([None if i % 13 == 0 else i / 7.0 for i in range(n)], pa.float64()),
        "weight": pa.array([float(i % 17) * 0.25 for i in range(n)], pa.float32()),
        "flag": pa.array([None if i % 9 == 4 else i % 3 == 0 for i in range(n)], pa.bool_()),
        "label": pa.array([["x", "y", "z"][i % 3] for i in range(n)], pa.string()),  # dictionary-friendly
    })


def chat_table(rng, n):
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    rows = []
    for i in range(n):
        if i % 10 == 7:
            rows.append(None)
            continue
        turns = []
        for t in range(i % 5):
            if t == 2 and i % 3 == 0:
                turns.append(None)
            else:
                content = None if (i + t) % 8 == 5 else " ".join(texts(rng, 2, nulls=False))
                turns.append({"role": ["user", "assistant"][t % 2], "content": content})
        rows.append(turns)
    return pa.table({
        "messages": pa.array(rows, pa.list_(message)),
        "prompt": pa.array(texts(rng, n, nulls=False), pa.string()),
        "tags": pa.array([[f"t{j}" for j in range(i % 4)] if i % 6 else None for i in range(n)], pa.list_(pa.string())),
        "grid": pa.array([[[i, j] for j in range(i % 3)] for i in range(n)], pa.list_(pa.list_(pa.int64()))),
        "meta": pa.array([{"source": f"s{i % 5}", "lengths": [i, i + 1]} if i % 4 else None for i in range(n)],
                         pa.struct([("source", pa.string()), ("lengths", pa.list_(pa.int32()))])),
        "counts": pa.array([[("a", i), ("b", i * 2)] if i % 5 else [] for i in range(n)],
                           pa.map_(pa.string(), pa.int64())),
    })


def expected_rows(path):
    """The rows as pyarrow reads them, maps (lists of key/value tuples there) as objects."""
    table = pq.read_table(path)

    def plain(v, t):
        if v is None:
            return None
        if pa.types.is_map(t):
            return {k: plain(x, t.item_type) for k, x in v}
        if pa.types.is_list(t):
            return [plain(x, t.value_type) for x in v]
        if pa.types.is_struct(t):
            return {t.field(i).name: plain(v[t.field(i).name], t.field(i).type) for i in range(t.num_fields)}
        return v

    return [{f.name: plain(row[f.name], f.type) for f in table.schema} for row in table.to_pylist()]


def other_writers(out, flat, chat):
    """polars' (Rust) and DuckDB's (C++) writers on the same tables, where they are installed."""
    written = []
    try:
        import polars as pl
        for name, table in [("flat", flat), ("chat", chat)]:
            frame = pl.from_arrow(table)
            for codec in ["snappy", "zstd", "lz4", "uncompressed"]:
                path = os.path.join(out, f"polars_{name}_{codec}.parquet")
                frame.write_parquet(path, compression=codec, row_group_size=700, data_page_size=4096)
                written.append(path)
    except ImportError:
        print("make_parquet_cases: polars not installed; no polars cases", file=sys.stderr)
    try:
        import duckdb
        con = duckdb.connect()
        for name, table in [("flat", flat), ("chat", chat)]:
            con.register("t", table)
            for codec, version in [("snappy", "V1"), ("gzip", "V1"), ("lz4", "V1"), ("zstd", "V2")]:
                path = os.path.join(out, f"duckdb_{name}_{codec}_{version}.parquet")
                con.execute(f"COPY t TO '{path}' (FORMAT parquet, COMPRESSION {codec}, PARQUET_VERSION {version}, "
                            "ROW_GROUP_SIZE 700)")
                written.append(path)
            con.unregister("t")
    except ImportError:
        print("make_parquet_cases: duckdb not installed; no DuckDB cases", file=sys.stderr)
    names = []
    for path in written:
        with open(path[:-len(".parquet")] + ".json", "w", encoding="utf-8") as f:
            json.dump(expected_rows(path), f, ensure_ascii=False)
        names.append(os.path.basename(path)[:-len(".parquet")])
    return names


def seeds(out):
    rng = random.Random(5)
    flat, chat = flat_table(rng, 40), chat_table(rng, 30)
    options = [dict(compression="snappy"), dict(compression="zstd", data_page_version="2.0"),
               dict(compression="gzip", use_dictionary=False), dict(compression="lz4", data_page_version="2.0"),
               dict(compression="none", use_dictionary=False, data_page_version="2.0",
                    column_encoding={"text": "DELTA_BYTE_ARRAY", "id": "DELTA_BINARY_PACKED",
                                     "score": "BYTE_STREAM_SPLIT"})]
    for i, o in enumerate(options):
        pq.write_table(flat, os.path.join(out, f"flat{i}.parquet"), **o)
    pq.write_table(chat, os.path.join(out, "chat.parquet"), compression="none")


def main():
    if sys.argv[1] == "--seeds":
        os.makedirs(sys.argv[2], exist_ok=True)
        seeds(sys.argv[2])
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    flat = flat_table(rng, 3000)
    chat = chat_table(rng, 1200)
    cases = {}
    for codec in ["none", "snappy", "gzip", "zstd", "lz4"]:
        for version in ["1.0", "2.0"]:
            cases[f"flat_{codec}_v{version[0]}"] = (flat, dict(compression=codec, data_page_version=version,
                                                                row_group_size=1000, data_page_size=4096))
    cases["flat_plain"] = (flat, dict(use_dictionary=False, compression="snappy"))
    cases["flat_one_group"] = (flat, dict(compression="zstd"))
    cases["flat_delta"] = (flat, dict(use_dictionary=False, compression="zstd", data_page_version="2.0",
                                      column_encoding={"text": "DELTA_LENGTH_BYTE_ARRAY", "id": "DELTA_BINARY_PACKED",
                                                       "small": "DELTA_BINARY_PACKED", "label": "DELTA_BYTE_ARRAY",
                                                       "score": "BYTE_STREAM_SPLIT", "weight": "BYTE_STREAM_SPLIT"},
                                      data_page_size=2048))
    cases["chat_snappy_v1"] = (chat, dict(compression="snappy", row_group_size=500, data_page_size=1024))
    cases["chat_zstd_v2"] = (chat, dict(compression="zstd", data_page_version="2.0", use_dictionary=False))
    cases["chat_legacy_lists"] = (chat, dict(compression="gzip", use_compliant_nested_type=False))
    long_text = pa.table({"text": ["x" * 3_000_000, "short", "y" * 1_500_000 + "é"]})
    cases["long_values"] = (long_text, dict(compression="snappy", use_dictionary=False))
    empty = pa.table({"text": pa.array([], pa.string())})
    cases["empty"] = (empty, dict())
    manifest = other_writers(out, flat, chat)
    for name, (table, options) in cases.items():
        path = os.path.join(out, name + ".parquet")
        pq.write_table(table, path, **options)
        with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(expected_rows(path), f, ensure_ascii=False)
        manifest.append(name)
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
