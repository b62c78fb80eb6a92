#!/usr/bin/env python3
"""Builds the Llama 2 tokenizer (SentencePiece BPE, 32000 pieces) in Hugging Face's
tokenizer.json format, for tests of our C++ tokenizer.

The vocabulary comes from PyPI: the llama-cpp-python sdist carries llama.cpp's test vocabulary
models/ggml-vocab-llama-spm.gguf (Llama 2's pieces, scores and token types) together with 46
test strings (.inp) and the ids Hugging Face's Llama 2 tokenizer gives them (.out). This script
reads the GGUF itself, derives the BPE merges from the SentencePiece vocabulary, writes
tokenizer.json and tokenizer_config.json, and with --verify checks with PyPI's `tokenizers`
that every test string encodes to the expected ids.

    llama2_tokenizer.py OUT_DIR [--sdist PATH] [--verify] [--check INP OUT]...

Nothing here is fetched unless --sdist is absent; then `pip download` fetches the pinned sdist
into a temporary folder. Only the three members named below are read out of the archive.
Exit status: 0 done, 1 failed (bad input, verification), 3 the download failed.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tarfile
import tempfile

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBER_DIR = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/models/"
GGUF_MEMBER = MEMBER_DIR + "ggml-vocab-llama-spm.gguf"
INP_MEMBER = GGUF_MEMBER + ".inp"
OUT_MEMBER = GGUF_MEMBER + ".out"
TEST_SEPARATOR = "\n__ggml_vocab_test__\n"

# llama.cpp's token types (tokenizer.ggml.token_type)
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(1, 7)

SPACE_MARK = "\u2581"  # SentencePiece's stand-in for a space


class Failure(Exception):
    """A problem worth one clear line to the user."""

    exit_code = 1


class DownloadFailure(Failure):
    """pip could not fetch the sdist (no network, say): callers may carry on without us."""

    exit_code = 3


# ---------------------------------------------------------------------------------------------
# GGUF metadata reader
# ---------------------------------------------------------------------------------------------

# value type -> (struct format, size); 7 (bool), 8 (string) and 9 (array) are handled apart
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_BOOL, _STRING, _ARRAY = 7, 8, 9


class GGUFReader:
    """Reads the header and the metadata key/values of a GGUF file (version 2 or 3) held in
    memory. Tensor infos and data are not needed here and are left unread."""

    def __init__(self, data, name="GGUF"):
        self.data = data
        self.name = name
        self.pos = 0

    def _take(self, n, what):
        if n < 0 or self.pos + n > len(self.data):
            raise Failure(f"{self.name}: truncated: {what} needs {n} bytes at offset {self.pos}, "
                          f"file has {len(self.data)}")
        start = self.pos
        self.pos += n
        return start

    def _scalar(self, vtype, what):
        fmt, size = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.data, self._take(size, what))[0]

    def _string(self, what):
        n = self._scalar(10, what + " length")
        start = self._take(n, what)
        try:
            return self.data[start:start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise Failure(f"{self.name}: {what} at offset {start} is not UTF-8 ({e})") from None

    def _value(self, vtype, what, depth=0):
        if vtype in _SCALARS:
            return self._scalar(vtype, what)
        if vtype == _BOOL:
            b = self.data[self._take(1, what)]
            if b > 1:
                raise Failure(f"{self.name}: {what}: bool byte {b} is neither 0 nor 1")
            return bool(b)
        if vtype == _STRING:
            return self._string(what)
        if vtype == _ARRAY:
            etype = self._scalar(4, what + " element type")
            count = self._scalar(10, what + " element count")
            if etype in _SCALARS:  # read a block at once
                fmt, size = _SCALARS[etype]
                start = self._take(size * count, f"{what} ({count} elements)")
                return list(struct.unpack_from(f"<{count}{fmt[1]}", self.data, start))
            if etype not in (_BOOL, _STRING, _ARRAY):
                raise Failure(f"{self.name}: {what}: unknown array element type {etype}")
            if etype == _ARRAY and depth >= 8:
                raise Failure(f"{self.name}: {what}: arrays nested more than 8 deep")
            # each element needs at least one byte: refuse absurd counts before looping
            if count > len(self.data) - self.pos:
                raise Failure(f"{self.name}: {what}: {count} elements cannot fit in the "
                              f"{len(self.data) - self.pos} bytes left")
            return [self._value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise Failure(f"{self.name}: {what}: unknown value type {vtype}")

    def read_metadata(self):
        magic = self.data[self._take(4, "magic"):self.pos]
        if magic != b"GGUF":
            raise Failure(f"{self.name}: not a GGUF file (magic {magic!r})")
        version = self._scalar(4, "version")
        if version not in (2, 3):
            raise Failure(f"{self.name}: GGUF version {version} is not supported (2 or 3 are)")
        tensor_count = self._scalar(10, "tensor count")
        kv_count = self._scalar(10, "metadata count")
        if kv_count > len(self.data):
            raise Failure(f"{self.name}: metadata count {kv_count} exceeds the file size")
        meta = {}
        for i in range(kv_count):
            key = self._string(f"key #{i}")
            vtype = self._scalar(4, f"type of {key}")
            if key in meta:
                raise Failure(f"{self.name}: key {key} appears twice")
            meta[key] = self._value(vtype, key)
        return version, tensor_count, meta


def read_vocab(gguf_bytes):
    version, _, meta = GGUFReader(gguf_bytes, "ggml-vocab-llama-spm.gguf").read_metadata()

    def need(key, kind):
        if key not in meta:
            raise Failure(f"GGUF: no {key}")
        value = meta[key]
        ok = (isinstance(value, list) if kind == "list"
              else isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise Failure(f"GGUF: {key} has an unexpected type ({type(value).__name__})")
        return value

    model = meta.get("tokenizer.ggml.model")
    if model != "llama":
        raise Failure(f"GGUF: tokenizer.ggml.model is {model!r}, expected 'llama' (SentencePiece)")
    tokens = need("tokenizer.ggml.tokens", "list")
    scores = need("tokenizer.ggml.scores", "list")
    types = need("tokenizer.ggml.token_type", "list")
    if not (len(tokens) == len(scores) == len(types)):
        raise Failure(f"GGUF: {len(tokens)} tokens, {len(scores)} scores, {len(types)} types")
    if not all(isinstance(t, str) and t for t in tokens):
        raise Failure("GGUF: tokenizer.ggml.tokens is not an array of non-empty strings")
    if not all(isinstance(x, float) and math.isfinite(x) for x in scores):
        raise Failure("GGUF: tokenizer.ggml.scores is not an array of finite float32")
    odd = sorted({t for t in types if isinstance(t, bool) or t not in range(1, 7)}, key=repr)
    if odd:
        raise Failure(f"GGUF: tokenizer.ggml.token_type holds unknown types {odd[:5]}")
    if types.count(TYPE_BYTE) != 256 or any(
            tokens[i] != f"<0x{b:02X}>" for b, i in
            enumerate(i for i, t in enumerate(types) if t == TYPE_BYTE)):
        raise Failure("GGUF: the byte pieces are not <0x00> ... <0xFF> in order")
    if len(set(tokens)) != len(tokens):
        raise Failure("GGUF: tokenizer.ggml.tokens has duplicates")
    special = {}
    for name in ("bos", "eos", "unknown"):
        tid = need(f"tokenizer.ggml.{name}_token_id", "int")
        if not 0 <= tid < len(tokens):
            raise Failure(f"GGUF: {name} token id {tid} is outside the vocabulary")
        special[name] = tid
    flags = {}
    for name, llama2 in (("bos", True), ("eos", False)):
        key = f"tokenizer.ggml.add_{name}_token"
        flags[name] = meta.get(key, llama2)
        if flags[name] is not llama2:  # Llama 2 adds <s> and not </s>
            raise Failure(f"GGUF: {key} is {flags[name]!r}, expected {llama2} as in Llama 2")
    return {"version": version, "tokens": tokens, "scores": scores, "types": types,
            "special": special, "flags": flags}


# ---------------------------------------------------------------------------------------------
# tokenizer.json
# ---------------------------------------------------------------------------------------------

def derive_merges(tokens, scores, types):
    """BPE merges of a SentencePiece BPE vocabulary, as Hugging Face's converter derives them:
    every split of a normal piece into two normal pieces is a merge, ranked by the merged piece's
    score (highest first), then by the ids of the left and the right part.

    The score is not the id: Llama 2 gives its 16 runs of spaces (ids 259, 268, ..., 29871) the
    score -1e9, so the merges that build them come last, after every other merge."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == TYPE_NORMAL}
    ranked = []
    for piece, pid in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lid, rid = normal.get(left), normal.get(right)
            if lid is not None and rid is not None:
                ranked.append((-scores[pid], lid, rid, left, right))
    ranked.sort()
    return [[left, right] for _, _, _, left, right in ranked]


def build_tokenizer_json(vocab):
    tokens, types, special = vocab["tokens"], vocab["types"], vocab["special"]
    unk, bos, eos = (tokens[special[k]] for k in ("unknown", "bos", "eos"))
    if (unk, bos, eos) != ("<unk>", "<s>", "</s>") or \
            (special["unknown"], special["bos"], special["eos"]) != (0, 1, 2):
        raise Failure(f"GGUF: special tokens are {unk}={special['unknown']}, "
                      f"{bos}={special['bos']}, {eos}={special['eos']}; expected <unk>=0, <s>=1, "
                      f"</s>=2 as in Llama 2")
    for tid in (0, 1, 2):
        expected = TYPE_UNKNOWN if tid == 0 else TYPE_CONTROL
        if types[tid] != expected:
            raise Failure(f"GGUF: {tokens[tid]} has token type {types[tid]}, expected {expected}")

    def added(tid):
        return {"id": tid, "content": tokens[tid], "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True}

    merges = derive_merges(tokens, vocab["scores"], types)
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(0), added(1), added(2)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPACE_MARK},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARK},
        ]},
        "pre_tokenizer": None,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [1], "tokens": [bos]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE_MARK}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
    }
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": None,
        "add_bos_token": vocab["flags"]["bos"],
        "add_eos_token": vocab["flags"]["eos"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    return doc, config, len(merges)


def write_atomic(path, data):
    """Writes bytes under a temporary name in the same folder, then renames it over `path`, so a
    reader never sees half a file; leaves the file alone when it already holds these bytes."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ---------------------------------------------------------------------------------------------
# sdist
# ---------------------------------------------------------------------------------------------

def download_sdist(folder):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
           "--retries", "2", "--timeout", "30", "--no-deps", "--no-binary", ":all:",
           "-d", folder, f"{SDIST_NAME}=={SDIST_VERSION}"]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        lines = [line.strip() for line in run.stdout.splitlines() if line.strip()]
        why = lines[-1] if lines else "(no output)"
        if any("ConnectionError" in line or "Retrying" in line for line in lines):
            why += " (network unreachable?)"
        raise DownloadFailure(f"pip download {SDIST_NAME}=={SDIST_VERSION} failed: {why}")
    name = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise Failure(f"pip download did not leave {name} in {folder}")
    return path


def read_members(sdist):
    """Reads the .gguf, .inp and .out members out of the sdist, without unpacking the rest."""
    h = hashlib.sha256()
    with open(sdist, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != SDIST_SHA256:
        raise Failure(f"{sdist}: sha256 {h.hexdigest()} is not that of "
                      f"{SDIST_NAME} {SDIST_VERSION} ({SDIST_SHA256})")
    wanted = {GGUF_MEMBER: None, INP_MEMBER: None, OUT_MEMBER: None}
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:  # the archive streams past; stop once all three are read
                if member.name in wanted:
                    if not member.isfile():
                        raise Failure(f"{sdist}: {member.name} is not a plain file")
                    wanted[member.name] = tar.extractfile(member).read()
                    if all(v is not None for v in wanted.values()):
                        break
    except (tarfile.TarError, OSError, EOFError) as e:
        raise Failure(f"{sdist}: cannot read the archive ({e})") from None
    missing = [name for name, data in wanted.items() if data is None]
    if missing:
        raise Failure(f"{sdist}: no {', '.join(missing)}")
    return wanted[GGUF_MEMBER], wanted[INP_MEMBER], wanted[OUT_MEMBER]


# ---------------------------------------------------------------------------------------------
# verification
# ---------------------------------------------------------------------------------------------

def parse_tests(inp, out, name):
    """llama.cpp's vocabulary tests: inputs joined by TEST_SEPARATOR (which also ends the file),
    expected ids one line per input."""
    texts = inp.decode("utf-8").split(TEST_SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    lines = out.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) != len(lines):
        raise Failure(f"{name}: {len(texts)} inputs but {len(lines)} lines of expected ids")
    try:
        ids = [[int(x) for x in line.split()] for line in lines]
    except ValueError as e:
        raise Failure(f"{name}: expected ids are not integers ({e})") from None
    return list(zip(texts, ids))


def import_tokenizer_class():
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise Failure(f"--verify needs the Python package `tokenizers` ({sys.executable} "
                      f"cannot import it; pip install tokenizers)") from None
    return Tokenizer


def verify(path, tests):
    """Encodes every test string with PyPI's tokenizers (no BOS) and decodes the ids back;
    returns (number of test strings, decode differences). Any encode mismatch raises."""
    try:
        tok = import_tokenizer_class().from_file(path)
    except Exception as e:  # tokenizers raises plain Exception for files it rejects
        raise Failure(f"tokenizers rejects the tokenizer.json written: {e}") from None
    bad, notes = [], []
    for name, cases in tests:
        for n, (text, expected) in enumerate(cases):
            got = tok.encode(text, add_special_tokens=False).ids
            if got != expected:
                bad.append(f"{name} #{n} {text[:40]!r}: got {got[:12]} expected {expected[:12]}")
                continue
            back = tok.decode(got, skip_special_tokens=False)
            if back != text:
                notes.append(f"{name} #{n}: decode gives {back[:40]!r} for {text[:40]!r}")
    total = sum(len(cases) for _, cases in tests)
    if bad:
        raise Failure(f"verification failed: {len(bad)} of {total} test strings encode "
                      f"differently; first: {bad[0]}")
    return total, notes


# ---------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder for tokenizer.json and tokenizer_config.json")
    parser.add_argument("--sdist", help=f"an already downloaded {SDIST_NAME}-{SDIST_VERSION} "
                        "sdist (.tar.gz); without it, pip downloads one to a temporary folder")
    parser.add_argument("--verify", action="store_true",
                        help="check the encodings of llama.cpp's test strings with `tokenizers`")
    parser.add_argument("--check", nargs=2, action="append", default=[], metavar=("INP", "OUT"),
                        help="with --verify, one more pair of test files in llama.cpp's format")
    args = parser.parse_args()

    try:
        if args.verify:
            import_tokenizer_class()  # fail before downloading anything
        with tempfile.TemporaryDirectory(prefix="llama2-tokenizer-") as tmp:
            sdist = args.sdist or download_sdist(tmp)
            gguf, inp, out = read_members(sdist)
        vocab = read_vocab(gguf)
        doc, config, n_merges = build_tokenizer_json(vocab)
        tests = [("llama-spm", parse_tests(inp, out, INP_MEMBER))]
        for inp_path, out_path in args.check:
            with open(inp_path, "rb") as fi, open(out_path, "rb") as fo:
                tests.append((os.path.basename(inp_path), parse_tests(fi.read(), fo.read(),
                                                                     inp_path)))

        os.makedirs(args.out_dir, exist_ok=True)
        json_path = os.path.join(args.out_dir, "tokenizer.json")
        # tests first, tokenizer.json last: its presence means the folder is complete
        write_atomic(os.path.join(args.out_dir, "llama-spm.inp"), inp)
        write_atomic(os.path.join(args.out_dir, "llama-spm.out"), out)
        write_atomic(os.path.join(args.out_dir, "tokenizer_config.json"),
                     (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        payload = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        summary = (f"llama2_tokenizer: {json_path}: {len(vocab['tokens'])} pieces, "
                   f"{n_merges} merges")
        if args.verify:  # check a candidate before it takes the final name
            fd, candidate = tempfile.mkstemp(dir=args.out_dir, prefix=".tokenizer.json.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(payload)
                total, notes = verify(candidate, tests)
            finally:
                os.unlink(candidate)
            summary += f"; {total}/{total} test strings encode as expected (tokenizers)"
            if notes:
                summary += f"; {len(notes)} decode differently (first: {notes[0]})"
        write_atomic(json_path, payload)
    except (Failure, OSError) as e:
        print(f"llama2_tokenizer: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
