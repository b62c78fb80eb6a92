// Token caches: documents read a block at a time equal the loaders' whole reads; a cache holds
// the streams the in-memory path builds, so training reads the same batches from it; its folder
// follows everything the streams depend on; builds that fail or race leave no partial folder.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/sft.h"
#include "data/token_cache.h"
#include "core/host.h"
#include "core/random.h"
#include "testing/compare.h"
#include "testing/temp_folder.h"
#include "testing/shared_data.h"
#include "train/training_data.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;
using testing::throws_with;

// A fresh folder per test (testing::TempFolderTest), with the cache folder inside it.
class TokenCache : public testing::TempFolderTest {
 protected:
  std::string cache_dir() const { return (dir_ / "cache").string(); }
  // The entries of the cache folder (complete caches and anything left behind).
  std::vector<std::string> cache_entries() const {
    std::vector<std::string> names;
    if (!fs::exists(cache_dir())) return names;
    for (const fs::directory_entry& e : fs::directory_iterator(cache_dir())) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
};

// Paragraphs with \r\n line ends, runs of blank (and whitespace-only) lines, a last
// document without a line end; many documents so blocks of a few bytes cut them everywhere.
std::string paragraphs(int n) {
  std::string s = "\n \t\n";
  for (int i = 0; i < n; ++i) {
    s += "document " + std::to_string(i) + " first line\r\n";
    if (i % 3 == 0) s += "  its second line, caf\xc3\xa9\n";
    s += i % 4 == 1 ? "\n\n \n" : "\n";
  }
  return s + "the last one, unended";
}

std::string jsonl(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i % 7 == 3) s += "   \n";  // blank lines are skipped
    s += "{\"id\": " + std::to_string(i) + ", \"text\": \"row " + std::to_string(i) +
         (i % 5 == 0 ? "" : " with \\\"quotes\\\" and\\nlines") + "\"}\n";
  }
  s += "{\"text\": \"\"}\n";  // an empty text is a document (BOS EOS)
  return s;
}

std::vector<std::string> drain_in_blocks(DocumentReader& reader, size_t max_bytes) {
  std::vector<std::string> docs;
  size_t calls = 0;
  while (reader.next(docs, max_bytes)) ++calls;
  EXPECT_GT(calls, 1u);
  return docs;
}

TEST_F(TokenCache, ReaderBlocksEqualTheWholeLoad) {
  const std::string txt = write("docs.txt", paragraphs(300));
  const std::vector<std::string> whole = load_text_documents(txt);
  ASSERT_EQ(whole.size(), 301u);
  EXPECT_EQ(whole[0], "document 0 first line\r\n  its second line, caf\xc3\xa9");
  EXPECT_EQ(whole.back(), "the last one, unended");
  for (size_t max_bytes : {1, 7, 4096}) {
    DocumentReader reader(txt, DocumentFormat::kText, "");
    EXPECT_EQ(drain_in_blocks(reader, max_bytes), whole) << max_bytes;
    EXPECT_EQ(reader.documents(), 301);
    EXPECT_DOUBLE_EQ(reader.progress(), 1.0);
  }
  const std::string jl = write("docs.jsonl", jsonl(500));
  const std::vector<std::string> rows = load_jsonl_documents(jl, "text");
  ASSERT_EQ(rows.size(), 501u);
  EXPECT_EQ(rows[1], "row 1 with \"quotes\" and\nlines");
  DocumentReader reader(jl, DocumentFormat::kJsonl, "text");
  EXPECT_EQ(drain_in_blocks(reader, 100), rows);

  const std::string bad = write("bad.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  DocumentReader bad_reader(bad, DocumentFormat::kJsonl, "text");
  std::vector<std::string> docs;
  EXPECT_TRUE(bad_reader.next(docs, 1));  // the first line, alone
  EXPECT_TRUE(throws_with([&] { bad_reader.next(docs, 1); }, "line 2: no field `text`"));
  DocumentReader empty(write("empty.txt", "\n\n  \n"), DocumentFormat::kText, "");
  EXPECT_FALSE(empty.next(docs, 1));
  EXPECT_TRUE(throws_with([&] { empty.check_not_empty(); }, "holds no documents"));
}

TEST_F(TokenCache, StreamsFromAReaderEqualStreamsFromTheDocuments) {
  const std::string txt = write("docs.txt", paragraphs(2000));
  ByteTokenizer t;
  const TokenStreams whole = build_token_streams(load_text_documents(txt), t, 0.2, 11);
  DocumentReader reader(txt, DocumentFormat::kText, "");
  const TokenStreams streamed = build_token_streams(reader, t, 0.2, 11);
  EXPECT_EQ(streamed.train, whole.train);
  EXPECT_EQ(streamed.val, whole.val);
  EXPECT_EQ(streamed.documents, whole.documents);
  EXPECT_EQ(streamed.bytes, whole.bytes);
  EXPECT_GT(whole.val.size(), whole.train.size() / 10);  // the split holds out about a fifth
  EXPECT_LT(whole.val.size(), whole.train.size() / 2);
}

bool same_ids(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::equal(a.data<int32_t>(), a.data<int32_t>() + a.numel(), b.data<int32_t>());
}

// The in-memory data and the cache's data give the same batches for `config`.
void expect_same_batches(const train::JobConfig& memory, const train::JobConfig& cached, const Tokenizer& t,
                         int64_t vocab) {
  const auto a = train::open_training_data(memory, t, vocab, 1);
  const auto b = train::open_training_data(cached, t, vocab, 1);
  const int64_t B = 3, T = memory.training.seq_len;
  ASSERT_EQ(a->eval_batches(B, T), b->eval_batches(B, T));
  ASSERT_GT(a->eval_batches(B, T), 0);
  EXPECT_EQ(a->held_out_size(), b->held_out_size());
  Tensor ids_a = Tensor::empty({B, T}, DType::kI32), targets_a = Tensor::empty({B, T}, DType::kI32);
  Tensor ids_b = Tensor::empty({B, T}, DType::kI32), targets_b = Tensor::empty({B, T}, DType::kI32);
  for (int64_t step = 0; step < 20; ++step) {
    a->fill_train(ids_a, targets_a, step + 1, step % 2, 4 * step);  // steps count from 1
    b->fill_train(ids_b, targets_b, step + 1, step % 2, 4 * step);
    ASSERT_TRUE(same_ids(ids_a, ids_b)) << "step " << step;
    ASSERT_TRUE(same_ids(targets_a, targets_b)) << "step " << step;
  }
  for (int64_t i = 0; i < a->eval_batches(B, T); ++i) {
    a->fill_eval(ids_a, targets_a, i);
    b->fill_eval(ids_b, targets_b, i);
    ASSERT_TRUE(same_ids(ids_a, ids_b)) << "eval batch " << i;
  }
}

train::JobConfig job(const std::string& source, const std::string& cache, const std::string& cache_dir) {
  train::JobConfig c;
  c.data.source = source;
  c.data.token_cache = cache;
  c.data.cache_dir = cache_dir;
  c.data.val_fraction = 0.1;
  c.training.seq_len = 32;
  c.training.seed = 5;
  return c;
}

TEST_F(TokenCache, TrainingReadsTheSameBatchesFromTheCache) {
  ByteTokenizer t;
  for (const auto& [name, contents] : {std::pair{"docs.txt", paragraphs(3000)}, std::pair{"docs.jsonl", jsonl(3000)}}) {
    const std::string source = write(name, contents);
    const train::JobConfig memory = job(source, "off", cache_dir());
    const train::JobConfig cached = job(source, "on", cache_dir());
    expect_same_batches(memory, cached, t, t.vocab_size());
    const auto again = train::open_training_data(cached, t, t.vocab_size(), 1);  // the folder is kept and reused
    EXPECT_NE(again->summary().find("made by an earlier launch"), std::string::npos) << again->summary();
  }
  const std::vector<std::string> entries = cache_entries();
  ASSERT_EQ(entries.size(), 2u);  // one complete folder per source, nothing left over
  EXPECT_EQ(entries[0].rfind("docs-", 0), 0u);
  EXPECT_EQ(entries[1].rfind("docs-", 0), 0u);
  EXPECT_NE(entries[0], entries[1]);
  for (const std::string& e : entries) EXPECT_TRUE(token_cache_complete((fs::path(cache_dir()) / e).string()));

  // auto leaves a source under 64 MiB in memory
  const auto small = train::open_training_data(job(write("small.txt", paragraphs(50)), "auto", cache_dir()), t,
                                               t.vocab_size(), 1);
  EXPECT_EQ(small->summary().find("token cache"), std::string::npos) << small->summary();
  EXPECT_EQ(cache_entries().size(), 2u);
}

TEST_F(TokenCache, TheLlama3TokenizerGivesTheSameBatches) {
  ST_REQUIRE_SHARED_DATA(shared);
  const BpeTokenizer t(shared + "/tokenizers/llama3/tokenizer.json");
  EXPECT_EQ(t.fingerprint().rfind("bpe-", 0), 0u);
  EXPECT_EQ(t.fingerprint(), BpeTokenizer(shared + "/tokenizers/llama3/tokenizer.json").fingerprint());
  train::JobConfig memory = job(shared + "/corpus/tinyshakespeare.txt", "off", cache_dir());
  memory.training.seq_len = 256;
  train::JobConfig cached = memory;
  cached.data.token_cache = "on";
  expect_same_batches(memory, cached, t, t.vocab_size());
}

TEST_F(TokenCache, TheFolderFollowsWhatTheStreamsDependOn) {
  const std::string source = write("corpus.jsonl", jsonl(50));
  ByteTokenizer byte;
  const TokenCacheKey key = document_cache_key({source, DocumentFormat::kJsonl, "text", 0.1, 5});
  const std::string base = token_cache_folder("/c", key, byte);
  EXPECT_EQ(fs::path(base).parent_path(), "/c");
  EXPECT_EQ(fs::path(base).filename().string().rfind("corpus-", 0), 0u) << base;
  EXPECT_EQ(token_cache_folder("/c", key, byte), base);
  auto changed = [&](auto mutate) {
    TokenCacheKey k = key;
    mutate(k);
    return token_cache_folder("/c", k, byte) != base;
  };
  EXPECT_TRUE(changed([&](TokenCacheKey& k) { k = document_cache_key({source, DocumentFormat::kJsonl, "text", 0.1, 6}); }));
  EXPECT_TRUE(changed([&](TokenCacheKey& k) {
    k = document_cache_key({source, DocumentFormat::kJsonl, "text", 0.1000001, 5});
  }));
  EXPECT_TRUE(changed([&](TokenCacheKey& k) { k = document_cache_key({source, DocumentFormat::kJsonl, "body", 0.1, 5}); }));
  EXPECT_TRUE(changed([&](TokenCacheKey& k) { k = document_cache_key({source, DocumentFormat::kText, "text", 0.1, 5}); }));
  EXPECT_TRUE(changed([](TokenCacheKey& k) { k.settings["train_on_prompt"] = true; }));
  ST_REQUIRE_SHARED_DATA(shared);
  const BpeTokenizer llama3(shared + "/tokenizers/llama3/tokenizer.json");
  EXPECT_NE(token_cache_folder("/c", key, llama3), base);
  // an edited source: another size, or the same size written later
  write("corpus.jsonl", jsonl(51));
  EXPECT_NE(token_cache_folder("/c", key, byte), base);
  write("corpus.jsonl", jsonl(50));
  fs::last_write_time(source, fs::last_write_time(source) + std::chrono::seconds(5));
  EXPECT_NE(token_cache_folder("/c", key, byte), base);
}

TEST_F(TokenCache, AFailedBuildLeavesNothingAndARaceKeepsTheFirstFolder) {
  ByteTokenizer t;
  std::string lines = jsonl(3000);
  lines += "{\"text\": 5}\n";
  const std::string bad = write("bad.jsonl", lines);
  const DocumentSource bad_documents{bad, DocumentFormat::kJsonl, "text", 0.1, 5};
  const std::string bad_folder = token_cache_folder(cache_dir(), document_cache_key(bad_documents), t);
  EXPECT_TRUE(throws_with([&] { build_token_cache(bad_folder, bad_documents, t, false); },
                          "line 3431: field `text` is not a string"));
  EXPECT_TRUE(cache_entries().empty());
  EXPECT_TRUE(throws_with([&] { train::open_training_data(job(bad, "on", cache_dir()), t, t.vocab_size(), 1); },
                          "line 3431"));
  EXPECT_TRUE(cache_entries().empty());

  const std::string good = write("good.jsonl", jsonl(300));
  const DocumentSource documents{good, DocumentFormat::kJsonl, "text", 0.1, 5};
  const TokenCacheKey key = document_cache_key(documents);
  const std::string folder = token_cache_folder(cache_dir(), key, t);
  const TokenCacheStats first = build_token_cache(folder, documents, t, false);
  EXPECT_TRUE(first.built);
  EXPECT_EQ(first.documents, 301);
  EXPECT_EQ(first.train_tokens + first.val_tokens, TokenFile((fs::path(folder) / "train.tok").string()).size() +
                                                       TokenFile((fs::path(folder) / "val.tok").string()).size());
  // a second process that finished after the first keeps the first one's folder
  const auto time = fs::last_write_time(fs::path(folder) / "train.tok");
  const TokenCacheStats second = build_token_cache(folder, documents, t, false);
  EXPECT_FALSE(second.built);
  EXPECT_EQ(fs::last_write_time(fs::path(folder) / "train.tok"), time);
  EXPECT_EQ(cache_entries().size(), 1u);

  // a tokenizer that cannot name itself gets no cache
  class Unnamed final : public Tokenizer {
   public:
    std::vector<int32_t> encode(std::string_view text) const override { return ByteTokenizer().encode(text); }
    std::string decode(std::span<const int32_t> ids) const override { return ByteTokenizer().decode(ids); }
    int64_t vocab_size() const override { return 258; }
    int32_t bos_id() const override { return ByteTokenizer::kBos; }
    int32_t eos_id() const override { return ByteTokenizer::kEos; }
  } unnamed;
  EXPECT_TRUE(throws_with([&] { train::open_training_data(job(good, "on", cache_dir()), unnamed, 258, 1); },
                          "the tokenizer does not say what it encodes by"));
}

bool have_pyarrow() { return std::system("python3 -c 'import pyarrow' > /dev/null 2>&1") == 0; }

TEST_F(TokenCache, ParquetShardsGiveTheSameBatches) {
  if (!have_pyarrow()) GTEST_SKIP() << "python3 cannot import pyarrow (scripts/setup.sh --tests installs it)";
  fs::create_directories(dir_ / "shards");
  const std::string script = write("make.py",
                                   "import sys, pyarrow as pa, pyarrow.parquet as pq\n"
                                   "for s in range(3):\n"
                                   "    texts = [None if i % 11 == 3 else f'shard {s} row {i} ' * (1 + i % 5)\n"
                                   "             for i in range(700)]\n"
                                   "    pq.write_table(pa.table({'text': texts}), f'{sys.argv[1]}/train-{s:05d}.parquet',\n"
                                   "                   row_group_size=128)\n");
  const std::string command = "python3 " + script + " " + (dir_ / "shards").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  write("shards/README.md", "# a dataset card, skipped\n");
  ByteTokenizer t;
  const std::string pattern = (dir_ / "shards" / "train-*.parquet").string();
  expect_same_batches(job(pattern, "off", cache_dir()), job(pattern, "on", cache_dir()), t, t.vocab_size());
  const std::vector<std::string> entries = cache_entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].rfind("shards-", 0), 0u) << entries[0];
}


std::vector<SftExample> random_examples(int n, int64_t vocab, uint64_t seed) {
  std::vector<SftExample> examples(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    SftExample& e = examples[static_cast<size_t>(i)];
    const uint64_t length = i == 3 ? 0 : hash3(seed, 1, static_cast<uint64_t>(i)) % 40;  // one empty example
    for (uint64_t k = 0; k < length; ++k) {
      e.ids.push_back(static_cast<int32_t>(hash3(seed, 2, static_cast<uint64_t>(i) * 1000 + k) % vocab));
      e.counted.push_back(static_cast<uint8_t>(hash3(seed, 3, static_cast<uint64_t>(i) * 1000 + k) % 2));
    }
    e.lost_turns = i % 5 == 0 ? 2 : 0;
  }
  return examples;
}

TEST_F(TokenCache, ExampleFilesRoundTripAndRefuseDamage) {
  const std::vector<SftExample> examples = random_examples(60, 300, 4);
  const std::string path = (dir_ / "examples.bin").string();
  write_sft_examples(path, examples, 300);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const std::vector<SftExample> back = read_sft_examples_file(path, 300);
  ASSERT_EQ(back.size(), examples.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].ids, examples[i].ids) << i;
    EXPECT_EQ(back[i].counted, examples[i].counted) << i;
    EXPECT_EQ(back[i].lost_turns, examples[i].lost_turns) << i;
  }
  EXPECT_TRUE(throws_with([&] { read_sft_examples_file(path, 299); }, "vocab_size 300 outside [1, the model's 299]"));

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto damaged = [&](const std::string& contents) {
    const std::string p = (dir_ / "damaged.bin").string();
    std::ofstream(p, std::ios::binary) << contents;
    return p;
  };
  EXPECT_TRUE(throws_with([&] { read_sft_examples_file(damaged(bytes.substr(0, bytes.size() - 1)), 300); },
                          "examples of"));
  EXPECT_TRUE(throws_with([&] { read_sft_examples_file(damaged("STSFT"), 300); }, "no STSFT header"));
  std::string over = bytes;
  const size_t ids_at = 40 + 8 * 61 + 4 * 60;
  over[ids_at] = static_cast<char>(0x2c);  // the first id (of example 0) becomes 300 + ...
  over[ids_at + 1] = 1;
  EXPECT_TRUE(throws_with([&] { read_sft_examples_file(damaged(over), 300); }, "example 0: id"));
  std::string flag = bytes;
  flag[flag.size() - 1] = 2;
  EXPECT_TRUE(throws_with([&] { read_sft_examples_file(damaged(flag), 300); }, "is not 0 or 1"));
  std::string order = bytes;
  order[40 + 8 * 2 + 7] = 1;  // example 1 ends far past the tokens
  EXPECT_TRUE(throws_with([&] { read_sft_examples_file(damaged(order), 300); }, "example 1 ends at"));
  // any byte changed: read or refused by name, never a crash
  int refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string m = bytes;
    const size_t at = hash3(9, 4, static_cast<uint64_t>(trial)) % m.size();
    m[at] = static_cast<char>(m[at] ^ (1 + hash3(9, 5, static_cast<uint64_t>(trial)) % 255));
    try {
      read_sft_examples_file(damaged(m), 300);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("damaged.bin"), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);
}

TEST_F(TokenCache, PromptResponseExamplesGiveTheSameBatches) {
  std::string lines;
  for (int i = 0; i < 3000; ++i)
    lines += "{\"prompt\": \"question " + std::to_string(i) + "?\", \"response\": \"answer " +
             std::string(static_cast<size_t>(i % 40), 'x') + "\"}\n";
  const std::string source = write("pairs.jsonl", lines);
  ByteTokenizer t;
  train::JobConfig memory = job(source, "off", cache_dir());
  memory.data.format = "sft";
  memory.training.seq_len = 64;
  train::JobConfig cached = memory;
  cached.data.token_cache = "on";
  expect_same_batches(memory, cached, t, t.vocab_size());
  const auto again = train::open_training_data(cached, t, t.vocab_size(), 1);
  EXPECT_NE(again->summary().find("token cache"), std::string::npos) << again->summary();
  EXPECT_NE(again->summary().find("made by an earlier launch"), std::string::npos) << again->summary();
  // the split and packing are drawn at each launch from the one cache: another seed, no new folder
  cached.training.seed = 77;
  memory.training.seed = 77;
  expect_same_batches(memory, cached, t, t.vocab_size());
  cached.data.train_on_prompt = true;  // other loss masks: another folder
  memory.data.train_on_prompt = true;
  expect_same_batches(memory, cached, t, t.vocab_size());
  EXPECT_EQ(cache_entries().size(), 2u);
}

TEST_F(TokenCache, ChatExamplesGiveTheSameBatchesAndFollowTheTemplate) {
  ST_REQUIRE_SHARED_DATA(shared);
  std::string lines;
  for (int i = 0; i < 400; ++i) {
    lines += "{\"messages\": [";
    if (i % 3 == 0) lines += "{\"role\": \"system\", \"content\": \"Be brief.\"}, ";
    lines += "{\"role\": \"user\", \"content\": \"What is " + std::to_string(i) + " plus one?\"}, "
             "{\"role\": \"assistant\", \"content\": \"It is " + std::to_string(i + 1) + ".\"}]}\n";
  }
  const std::string source = write("chats.jsonl", lines);
  // the tokenizer from a folder of our own, so that its template can change
  fs::create_directories(dir_ / "tok");
  fs::copy_file(shared + "/tokenizers/llama3/tokenizer.json", dir_ / "tok" / "tokenizer.json");
  fs::copy_file(shared + "/tokenizers/llama3/tokenizer_config.json", dir_ / "tok" / "tokenizer_config.json");
  const BpeTokenizer t((dir_ / "tok").string());
  ASSERT_TRUE(t.has_chat_template()) << t.chat_template_problem();
  train::JobConfig memory = job(source, "off", cache_dir());
  memory.data.format = "chat";
  memory.training.seq_len = 128;
  train::JobConfig cached = memory;
  cached.data.token_cache = "on";
  expect_same_batches(memory, cached, t, t.vocab_size());
  ASSERT_EQ(cache_entries().size(), 1u);

  // another chat template is another tokenizer fingerprint, so another folder
  std::string config;
  {
    std::ifstream in(dir_ / "tok" / "tokenizer_config.json");
    config.assign(std::istreambuf_iterator<char>(in), {});
  }
  // each header ends in one line break instead of two: other tokens for every example; a
  // stale folder would give the old ones, which the in-memory path no longer does
  const std::string two = "<|end_header_id|>\\n\\n";
  int replaced = 0;
  for (size_t at = config.find(two); at != std::string::npos; at = config.find(two, at), ++replaced)
    config.replace(at, two.size(), "<|end_header_id|>\\n");
  ASSERT_EQ(replaced, 2);
  std::ofstream(dir_ / "tok" / "tokenizer_config.json") << config;
  const BpeTokenizer edited((dir_ / "tok").string());
  EXPECT_NE(edited.fingerprint(), t.fingerprint());
  EXPECT_NE(token_cache_folder("/c", TokenCacheKey{source, "chat", {}}, edited),
            token_cache_folder("/c", TokenCacheKey{source, "chat", {}}, t));
  expect_same_batches(memory, cached, edited, edited.vocab_size());
  EXPECT_EQ(cache_entries().size(), 2u);
}


// A folder or pattern of JSONL or text files reads as the files one after another, in name
// order (compressed ones too): the documents, the split and the batches of the concatenated
// file, in memory and from a token cache, which follows each file; errors name the file.
TEST_F(TokenCache, FoldersAndPatternsOfJsonlAndTextFilesReadAsTheirConcatenation) {
  fs::create_directories(dir_ / "shards");
  const std::string a = jsonl(900), b = jsonl(1400);
  write("shards/part-1.jsonl", a);
  write("plain.jsonl", b);
  ASSERT_EQ(std::system(("gzip -c " + (dir_ / "plain.jsonl").string() + " > " + (dir_ / "shards/part-0.jsonl.gz").string())
                            .c_str()),
            0);
  write("shards/README.md", "# a dataset card\n");
  write("shards/notes.txt", "not a document of a JSONL folder\n");
  const std::string folder = (dir_ / "shards").string();
  const std::string concatenated = write("ba.jsonl", b + a);  // part-0 (b) before part-1 (a)

  std::vector<std::string> whole = load_jsonl_documents(concatenated, "text");
  EXPECT_EQ(load_jsonl_documents(folder, "text"), whole);
  DocumentReader reader(folder, DocumentFormat::kJsonl, "text");
  EXPECT_EQ(reader.files().size(), 2u);
  EXPECT_EQ(drain_in_blocks(reader, 3000), whole);  // blocks that cross from one file to the next
  EXPECT_EQ(load_jsonl_documents(folder + "/part-*", "text"), whole);

  train::DataSection d;
  d.source = folder;
  EXPECT_EQ(train::resolve_data_format(d), "jsonl");
  d.source = folder + "/part-*";
  EXPECT_EQ(train::resolve_data_format(d), "jsonl");
  d.source = folder + "/*.md";
  EXPECT_TRUE(throws_with([&] { train::resolve_data_format(d); }, "none of them a token file"));

  ByteTokenizer t;
  expect_same_batches(job(concatenated, "off", cache_dir()), job(folder, "off", cache_dir()), t, t.vocab_size());
  expect_same_batches(job(concatenated, "off", cache_dir()), job(folder, "on", cache_dir()), t, t.vocab_size());
  const TokenCacheKey key = document_cache_key({folder, DocumentFormat::kJsonl, "text", 0.1, 5});
  EXPECT_EQ(token_cache_source_files(key).size(), 2u);
  const std::string before = token_cache_folder(cache_dir(), key, t);
  write("shards/part-1.jsonl", a + "{\"text\": \"one more\"}\n");  // a file of the folder edited: a new cache
  EXPECT_NE(token_cache_folder(cache_dir(), key, t), before);

  // an error names the file and its own line
  write("shards/part-2.jsonl", "{\"text\": \"fine\"}\n{\"text\": 7}\n");
  EXPECT_TRUE(throws_with([&] { load_jsonl_documents(folder, "text"); }, "part-2.jsonl` line 2: field `text` is not a string"));

  // text files: a document ends with its file
  fs::create_directories(dir_ / "books");
  write("books/a.txt", "first book, one\n\nfirst book, two");
  write("books/b.txt", "second book");
  write("books/c.txt", "\n\n");
  EXPECT_EQ(load_text_documents((dir_ / "books").string()),
            (std::vector<std::string>{"first book, one", "first book, two", "second book"}));
  d.source = (dir_ / "books").string();
  EXPECT_EQ(train::resolve_data_format(d), "text");
  fs::create_directories(dir_ / "empty");
  write("empty/x.txt", "\n");
  write("empty/y.txt", "  \n");
  EXPECT_TRUE(throws_with([&] { load_text_documents((dir_ / "empty").string()); },
                          "the 2 text files of `" + (dir_ / "empty").string() + "` hold no documents"));
  EXPECT_TRUE(throws_with([&] { load_text_documents((dir_ / "shards").string() + "/nothing-*"); }, "matches no file"));
}

// Fine-tuning examples from a folder of JSONL files: the examples of the concatenated file.
TEST_F(TokenCache, AFolderOfExampleFilesReadsAsTheirConcatenation) {
  std::string first, second;
  for (int i = 0; i < 600; ++i)
    (i < 250 ? first : second) += "{\"prompt\": \"question " + std::to_string(i) + "?\", \"response\": \"answer " +
                                  std::string(static_cast<size_t>(i % 30), 'y') + "\"}\n";
  fs::create_directories(dir_ / "sft");
  write("sft/train-00000.jsonl", first);
  write("sft/train-00001.jsonl", second);
  write("sft/README.md", "# card\n");
  const std::string concatenated = write("all.jsonl", first + second);
  ByteTokenizer t;
  train::JobConfig whole = job(concatenated, "off", cache_dir());
  whole.data.format = "sft";
  whole.training.seq_len = 64;
  train::JobConfig folder = whole;
  folder.data.source = (dir_ / "sft").string();
  expect_same_batches(whole, folder, t, t.vocab_size());
  folder.data.token_cache = "on";
  expect_same_batches(whole, folder, t, t.vocab_size());
  EXPECT_EQ(example_files(folder.data.source).files.size(), 2u);
  EXPECT_FALSE(example_files(folder.data.source).parquet);
  write("sft/train-00002.jsonl", "{\"prompt\": \"q\"}\n");
  SftOptions o;
  o.seq_len = 64;
  EXPECT_TRUE(throws_with([&] { read_sft_examples(folder.data.source, t, o); }, "train-00002.jsonl` line 1"));
}

// `shardtrain cache`: each folder's state from its name and source.json; prune removes what no
// launch can read again, and by choice what has not been used, never a running build nor
// anything in the folder that is not a cache.
TEST_F(TokenCache, TheDirectoryListsItsFoldersAndPrunesWhatNoLaunchReads) {
  using State = TokenCacheEntry::State;
  EXPECT_TRUE(scan_token_cache_dir((dir_ / "none").string()).empty());
  ByteTokenizer t;
  const std::string kept = write("kept.txt", paragraphs(200));
  const std::string edited = write("edited.jsonl", jsonl(100));
  const std::string gone = write("gone.jsonl", jsonl(100));
  std::map<std::string, std::string> folder;  // source -> its cache folder
  for (const std::string& source : {kept, edited, gone}) {
    // through the trainer's opening, which marks the folder used
    train::open_training_data(job(source, "on", cache_dir()), t, t.vocab_size(), 1);
    const std::string format = source == kept ? "text" : "jsonl";
    folder[source] = token_cache_folder(
        cache_dir(), document_cache_key({source, parse_document_format(format), "text", 0.1, 5}), t);
    ASSERT_TRUE(token_cache_complete(folder[source])) << folder[source];
  }
  write("edited.jsonl", jsonl(101));
  fs::remove(gone);
  const fs::path cache(cache_dir());
  const std::string host = host_name();
  pid_t dead = ::fork();  // a process that is gone: its pid, after it exited and was waited for
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string stem = "corpus-0123456789abcdef";
  const fs::path running = cache / fmt::format("{}.tmp-{}-{}", stem, host, ::getpid());
  const fs::path abandoned = cache / fmt::format("{}.tmp-{}-{}", stem, host, dead);
  const fs::path elsewhere = cache / fmt::format("{}.tmp-{}-{}", stem, host + "-other", 7);
  const fs::path no_info = cache / "damaged-00000000000000aa";
  const fs::path bad_info = cache / "damaged-00000000000000bb";
  for (const fs::path& p : {running, abandoned, elsewhere, no_info, bad_info, cache / "notes",
                            cache / "x-0123456789abcdef.tmp-host-pid"})
    fs::create_directories(p);
  write("cache/damaged-00000000000000bb/source.json", "{\"source\": \"a.txt\"}");  // no files, no version
  write("cache/readme.txt", "mine");
  write("cache/corpus-0123456789abcdef.tmp-" + host + "-" + std::to_string(::getpid()) + "/train.tok",
        std::string(1000, 'x'));

  auto scan = [&] {
    std::map<std::string, TokenCacheEntry> by_path;
    for (TokenCacheEntry& e : scan_token_cache_dir(cache_dir())) by_path[e.path] = std::move(e);
    return by_path;
  };
  std::map<std::string, TokenCacheEntry> entries = scan();
  ASSERT_EQ(entries.size(), 8u);  // not notes/, readme.txt, nor a name whose process is not a number
  auto state = [&](const std::string& path) { return entries.at(path).state; };
  EXPECT_EQ(state(folder[kept]), State::kCurrent);
  EXPECT_EQ(entries.at(folder[kept]).detail, "");
  EXPECT_EQ(entries.at(folder[kept]).info.at("source"), kept);
  EXPECT_EQ(entries.at(folder[kept]).bytes, fs::file_size(fs::path(folder[kept]) / "train.tok") +
                                                fs::file_size(fs::path(folder[kept]) / "val.tok") +
                                                fs::file_size(fs::path(folder[kept]) / "source.json"));
  EXPECT_LT(entries.at(folder[kept]).idle_seconds, 60);
  EXPECT_EQ(state(folder[edited]), State::kStale);
  EXPECT_NE(entries.at(folder[edited]).detail.find("`" + edited + "` changed after the build"), std::string::npos)
      << entries.at(folder[edited]).detail;
  EXPECT_EQ(state(folder[gone]), State::kStale);
  EXPECT_NE(entries.at(folder[gone]).detail.find("`" + gone + "` is gone"), std::string::npos);
  EXPECT_EQ(state(running.string()), State::kBuilding);
  EXPECT_EQ(entries.at(running.string()).bytes, 1000u);
  EXPECT_EQ(state(abandoned.string()), State::kAbandoned);
  EXPECT_EQ(state(elsewhere.string()), State::kElsewhere);
  EXPECT_NE(entries.at(elsewhere.string()).detail.find("`" + host + "-other`"), std::string::npos);
  EXPECT_EQ(state(no_info.string()), State::kDamaged);
  EXPECT_EQ(state(bad_info.string()), State::kDamaged);
  EXPECT_NE(entries.at(bad_info.string()).detail.find("does not say what the cache was made from"), std::string::npos);

  auto prunable = [&](const TokenCachePrune& p) {
    std::set<std::string> names;
    for (const auto& [path, e] : entries)
      if (token_cache_prunable(e, p)) names.insert(path);
    return names;
  };
  const std::set<std::string> unreadable = {folder[edited], folder[gone], abandoned.string(), no_info.string(),
                                            bad_info.string()};
  EXPECT_EQ(prunable({}), unreadable);
  // unused for ten days: the current folder and the other machine's build go with 7 days, not 30
  for (const fs::path& p : {fs::path(folder[kept]), elsewhere})
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::hours(24 * 10));
  entries = scan();
  EXPECT_GT(entries.at(folder[kept]).idle_seconds, 9.9 * 86400);
  EXPECT_EQ(prunable({30, false}), unreadable);
  std::set<std::string> idle = unreadable;
  idle.insert({folder[kept], elsewhere.string()});
  EXPECT_EQ(prunable({7, false}), idle);
  EXPECT_EQ(prunable({-1, true}), idle);  // all: everything but the build still running here
  // a launch that reads the folder marks it used again
  train::open_training_data(job(kept, "on", cache_dir()), t, t.vocab_size(), 1);
  entries = scan();
  EXPECT_LT(entries.at(folder[kept]).idle_seconds, 60);
  EXPECT_EQ(prunable({7, false}).count(folder[kept]), 0u);
}

}  // namespace
}  // namespace shardtrain::data
