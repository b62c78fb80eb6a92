// The command table: dispatch, the overview and each command's help come from these rows, so
// they cannot disagree.
#include "cli/command_table.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/nearest_name.h"
#include "train/config.h"

namespace shardtrain::cli {

namespace {

constexpr const char* kJobOptions =
    "  CONFIG.toml, -c FILE, --config FILE\n"
    "                        the job's TOML file (none: the built-in default job)\n"
    "  --section.key=value, --section.key value\n"
    "                        a config key's value over the file's (`shardtrain help config` lists the\n"
    "                        keys); a boolean key alone means true (--training.deterministic); a value\n"
    "                        that starts with `--` needs the `=` form\n";

const std::vector<Command>& table() {
  static const std::vector<Command> rows = {
      {"train", run_train, "train [CONFIG.toml] [--section.key=value | --section.key value ...]",
       "train a model (no arguments: the built-in default job on Debian's fortunes corpus)",
       "Trains the job: the TOML file's keys over the defaults, the overrides over both. The run folder\n"
       "(run.output_dir) keeps the resolved config (config.toml), the log (train.log), the metrics\n"
       "(`shardtrain plot` draws them) and the final sample (sample.txt); checkpoints and the export as\n"
       "the config says, each checkpoint with its config. With --checkpoint.resume=auto the run goes on\n"
       "with its checkpoint's config (only the keys this command sets change it, and not the model or\n"
       "the data); a folder holding another run's checkpoints needs --checkpoint.resume=auto or\n"
       "--run.overwrite=true. Exit status 0 when done, 75 when stopped by training.time_limit, 128+N\n"
       "when stopped by signal N (saved; the log ends with the command that resumes).\n",
       "shardtrain train configs/llama3.2-1b-finetune.toml --training.steps 200 --run.output_dir runs/a",
       true},
      {"print-config", run_print_config, "print-config [CONFIG.toml] [--section.key=value | --section.key value ...]",
       "show every key's effective value and where it came from",
       "Prints every config key as `key = value  # source: doc`, the source being default, file or\n"
       "override; the output is a valid TOML job.\n",
       "shardtrain print-config configs/llama3.1-8b-finetune.toml --training.steps 10",
       true},
      {"plan", run_plan,
       "plan [CONFIG.toml] [--ranks N] [--ranks-per-machine M] [--gpu NAME] [--calibration FILE]\n"
       "     [--gpus-per-node G] [--nvlink-gbps X] [--inter-node-gbps X] [--host-gbps X] [--pcie-gbps X]\n"
       "     [--mfu X] [--section.key=value | --section.key value ...]",
       "memory per rank, FLOPs, step time and job duration of a job, without training",
       "Checks the job (config, model shape, mesh) and prints its memory per rank, the FLOPs per token,\n"
       "whether it fits, and a predicted step time and job duration, without allocating or training.\n"
       "The step time is modelled op family by op family: the products at the GPU's measured matmul\n"
       "rate (bf16 or FP8), attention at its measured rate for the sequence length, the streaming\n"
       "passes (norms, RoPE, SwiGLU, the loss, quantisation, AdamW) as bytes over the memory\n"
       "bandwidth, recomputation included; each block's gathers and reduce-scatters (and the tensor-\n"
       "parallel exchanges, the replicas' all-reduce) on NVLink or the network, overlapped with the\n"
       "compute but for the first gather and the last reduce-scatter; with parallel.offload the host\n"
       "AdamW beside the next forward and the copies over PCIe. With --mfu X it is instead the step's\n"
       "FLOPs / (N x the GPU's peak x X). model.preset (e.g. llama3.1-8b) plans a published model's\n"
       "shape with nothing downloaded; so does a model.hf folder that is not there yet but carries\n"
       "such a model's usual name. A job whose sequences are too long for an 80 GB GPU, however many\n"
       "ranks shard its weights, is shown the smallest parallel.context_parallel that splits them\n"
       "enough, with the activation offload it takes.\n"
       "\n"
       "options:\n"
       "  --ranks N             the world size to plan for (default: the launch's, else 1)\n"
       "  --ranks-per-machine M ranks sharing one machine's host memory (default: the launch's local\n"
       "                        ranks, else all N)\n"
       "  --gpu NAME            h100-sxm, h100-pcie, h200 or a100: the GPU of the time (default: the\n"
       "                        calibration's, else the visible GPU, else h100-sxm)\n"
       "  --calibration FILE    per-op-family rates measured on your GPU, JSON: {\"gpu\": \"h100-sxm\",\n"
       "                        \"matmul_bf16_tflops\": 712, \"matmul_fp8_tflops\": 1305,\n"
       "                        \"attention_forward_tflops\": 393, \"attention_backward_tflops\": 295,\n"
       "                        \"attention_seq_len\": 4096, \"attention_forward_fp8_tflops\": 627,\n"
       "                        \"attention_backward_fp8_tflops\": 471, \"memory_gbps\": 2680,\n"
       "                        \"fp8_quantize_gbps\": 2010}, every field optional (default: the GPU's\n"
       "                        measured defaults); `shardtrain bench JOB --calibration FILE` writes\n"
       "                        one from a profiled run of the job on your GPU\n"
       "  --gpus-per-node G     GPUs sharing a node's NVLink and host memory (default 8)\n"
       "  --nvlink-gbps X       NVLink GB/s per GPU and direction, achieved (default 360)\n"
       "  --inter-node-gbps X   network Gb/s per node and direction (default 3200: 8 x 400 Gb/s)\n"
       "  --host-gbps X         host memory GB/s per node, for the offloaded AdamW (default 100)\n"
       "  --pcie-gbps X         PCIe GB/s per GPU and direction (default 50)\n"
       "  --mfu X               instead of the model: FLOPs / (N x peak x X), X in (0, 1]\n"
       "                        (`shardtrain bench` measures a job's MFU)\n",
       "shardtrain plan configs/llama3.1-8b-finetune.toml --ranks 8",
       true},
      {"bench", run_bench,
       "bench [CONFIG.toml] [--steps N] [--warmup W] [--json FILE] [--calibration FILE]\n"
       "      [--sweep KEY=V1,V2,...]\n"
       "      [--section.key=value | --section.key value ...]",
       "time the job's training step on random tokens",
       "Runs the job's training step on random tokens (with model.hf or model.preset: random weights\n"
       "of its shape) and\n"
       "reports tokens/s, MFU, the time by phase, peak memory and the GPU board; writes no files but\n"
       "the --json and --calibration ones.\n"
       "\n"
       "options:\n"
       "  --steps N             timed steps (default 10)\n"
       "  --warmup W            warm-up steps before them (default 3, at least 1)\n"
       "  --json FILE           also write the figures to FILE as JSON\n"
       "  --calibration FILE    profile the timed steps per op (as SHARDTRAIN_PROFILE=1) and write the\n"
       "                        rates `plan --calibration FILE` reads: matmul, attention, memory passes\n"
       "  --sweep KEY=V1,V2,... run every combination of the values in turn and print one table;\n"
       "                        repeatable (one process only)\n",
       "shardtrain bench configs/llama3.2-1b-finetune.toml --steps 20 --sweep training.batch_size=1,2,4",
       true},
      {"inspect", run_inspect, "inspect PATH [--verify]",
       "tensors and shape of a model file or folder, a Parquet file or a checkpoint",
       "PATH is one of:\n"
       "  a .safetensors file or a Hugging Face folder: its tensors, metadata and model shape\n"
       "  a .parquet file: its fields, types and first row\n"
       "  a checkpoint (a step_* directory, or the folder holding `latest`): its step, ranks, model,\n"
       "  files and whether every element of every parameter is there\n"
       "\n"
       "options:\n"
       "  --verify   also read every tensor whole: its bytes against the CRC32C the file carries\n"
       "             (files shardtrain writes carry one per tensor; other writers' none) and its\n"
       "             values for NaN and inf; each problem is named with its file and tensor\n"
       "Exits 1 when something is missing or damaged, naming it.\n",
       "shardtrain inspect --verify runs/a/checkpoints"},
      {"export", run_export,
       "export CHECKPOINT OUT [--dtype bf16|f16|f32] [--max-shard-mb N] [--tokenizer FOLDER|byte]",
       "a Hugging Face folder from a training checkpoint",
       "Writes OUT as a Hugging Face folder (sharded safetensors, index, config.json with the BOS/EOS\n"
       "ids, tokenizer files: the byte-level tokenizer as tokenizer.json for a byte model) from\n"
       "CHECKPOINT: a step_* directory, or the folder holding `latest`. OUT is written beside its\n"
       "place and swapped in whole.\n"
       "\n"
       "options:\n"
       "  --dtype D             bf16, f16 or f32 (default bf16)\n"
       "  --max-shard-mb N      the largest safetensors file, in MB (default 5 GiB)\n"
       "  --tokenizer FOLDER    where the tokenizer files come from (default: the one the run recorded;\n"
       "                        `byte`: the byte-level tokenizer)\n",
       "shardtrain export runs/a/checkpoints runs/a/hf --dtype bf16"},
      {"generate", run_generate,
       "generate MODEL --prompt TEXT|- [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
       "         [--tokenizer PATH] [--device D] [--recompute] [--eager] [--chat [--system TEXT]]\n"
       "generate MODEL --conversation FILE|- [options]",
       "continue a prompt, or reply to a chat, with a model",
       "MODEL is a Hugging Face folder or a training checkpoint.\n"
       "\n"
       "options:\n"
       "  --prompt TEXT         the text to continue (`-`: standard input; \"\": from BOS alone)\n"
       "  --tokens N            tokens to generate (default 200)\n"
       "  --temperature T       0 is greedy (default 0.8)\n"
       "  --top-k K             sample among the K most likely tokens; 0 is all (default 40)\n"
       "  --top-p P             nucleus sampling; 1 is all (default 1)\n"
       "  --seed S              the sampler's seed (default 7)\n"
       "  --tokenizer PATH      a tokenizer.json, its folder, or `byte` (default: the model's)\n"
       "  --device D            auto (a GPU if visible, bf16), cpu (f32) or cuda (default auto)\n"
       "  --recompute           no KV cache (slower, for checks)\n"
       "  --eager               no CUDA graph for the GPU's steps\n"
       "  --chat                TEXT is a user's message in the tokenizer's chat template; prints the reply\n"
       "  --system TEXT         with --chat: a system message before it\n"
       "  --conversation FILE   reply to a conversation: a JSON object like a chat data line,\n"
       "                        {\"messages\": [...], \"tools\": [...]} (`-`: standard input)\n",
       "shardtrain generate runs/a/hf --prompt \"The capital of France is\" --tokens 40 --temperature 0"},
      {"tokenize", run_tokenize,
       "tokenize --tokenizer PATH --print-ids\n"
       "tokenize --tokenizer PATH INPUT OUTPUT [--format lines|jsonl|parquet|whole] [--field NAME]\n"
       "         [--threads N] [--files N] [--skip-existing]",
       "text, JSONL or Parquet into a token file for training",
       "Writes OUTPUT as a token file (BOS, ids, EOS per document) for `train --data.source=OUTPUT`;\n"
       "with --print-ids, prints the ids of each standard-input line instead. INPUT may be a folder or\n"
       "a pattern ('data/*.parquet'): each file becomes OUTPUT/<its name>.tok.\n"
       "\n"
       "options:\n"
       "  --tokenizer PATH      a tokenizer.json, its folder, or `byte` (required)\n"
       "  --format F            lines, jsonl (.gz, .zst too), parquet or whole (default: parquet for a\n"
       "                        Parquet INPUT, jsonl for .jsonl or .json, else lines)\n"
       "  --field NAME          the JSONL or Parquet text field (default text)\n"
       "  --threads N           threads in all (default: every core)\n"
       "  --files N             files tokenized at once, each with its share of the threads (default:\n"
       "                        one per 8 threads)\n"
       "  --skip-existing       keep the token files already made with this tokenizer\n",
       "shardtrain tokenize --tokenizer models/llama3 'data/*.parquet' tokens/"},
      {"cache", run_cache, "cache [list|prune] [--dir DIR] [--unused-days N] [--all] [--dry-run]",
       "list or prune the token caches (data.token_cache)",
       "list (the default) shows each cache folder's state, size, last use and source; prune removes\n"
       "the stale ones (a source file changed or gone), damaged ones and builds whose process is gone.\n"
       "\n"
       "options:\n"
       "  --dir DIR             the caches' folder (default $XDG_CACHE_HOME/shardtrain/tokens, else\n"
       "                        ~/.cache/shardtrain/tokens)\n"
       "  --unused-days N       prune also those unused for N days\n"
       "  --all                 prune every one but a build still running here\n"
       "  --dry-run             name what prune would remove, remove nothing\n",
       "shardtrain cache prune --unused-days 30 --dry-run"},
      {"plot", run_plot, "plot RUN_DIR|METRICS.jsonl [--out FILE.svg] [--metrics NAME,NAME,...]",
       "draw a run's metrics (loss, held-out loss, learning rate, tokens/s) as an SVG",
       "Reads RUN_DIR/metrics.jsonl (or the metrics file given) and draws one panel per metric, the\n"
       "step on the x axis; the training loss and the held-out loss share a panel.\n"
       "\n"
       "options:\n"
       "  --out FILE.svg        where to write (default RUN_DIR/loss.svg, beside the metrics file)\n"
       "  --metrics NAMES       the metrics, comma-separated (default loss,eval_loss,lr,tokens_per_second);\n"
       "                        any numeric field of the file, e.g. grad_norm or mfu; tokens_per_s is\n"
       "                        tokens_per_second\n",
       "shardtrain plot runs/a --metrics loss,eval_loss,grad_norm"},
      {"batches", run_batches,
       "batches [CONFIG.toml] --out FILE.safetensors [--ranks N] [--section.key=value | --section.key value ...]",
       "write the token batches a job trains and evaluates on, for another engine or a look",
       "Reads the job's data as `train` does and writes every batch it would train on, and the held-out\n"
       "batches it would evaluate, to one safetensors file: train.ids and train.targets [steps,\n"
       "micro-batches, sequences, seq_len] (i32; a target of -100 counts no loss), eval.ids and\n"
       "eval.targets [batches, sequences, seq_len], train.positions and eval.positions with\n"
       "data.document_mask, and lr [steps]. Its metadata holds the resolved job (`config`) and, as\n"
       "JSON (`recipe`), what another engine needs to train alike: the loss's normalisation, AdamW's\n"
       "settings, clipping, the steps that evaluate. bench/train/convergence.py trains PyTorch on\n"
       "these rows beside shardtrain.\n"
       "\n"
       "options:\n"
       "  --out FILE            where to write (required)\n"
       "  --ranks N             data-parallel ranks sharing each global batch (default 1)\n",
       "shardtrain batches --data.source=docs.jsonl --training.steps 100 --out batches.safetensors"},
      {"version", run_version, "version",
       "the commit this binary was built from, its backends, GPU libraries, GPUs and host",
       "Prints the build's commit and options, the GPU libraries it loads, the GPUs it sees and the\n"
       "host's cores and memory. `shardtrain --version` is the same.\n",
       "shardtrain version"},
      {"help", run_help, "help [COMMAND | config]", "this overview, a command's help, or every config key",
       "Without an argument: every command with its summary. With a COMMAND: its usage, options and an\n"
       "example (as `shardtrain COMMAND --help`). With `config`: a table of every config key, its type,\n"
       "default and meaning.\n",
       "shardtrain help train"},
  };
  return rows;
}

// A usage's lines after "  shardtrain ", its continuation lines (they start with a space) lined
// up under them.
std::string usage_lines(const std::string& usage) {
  std::string out;
  size_t start = 0;
  while (start < usage.size()) {
    const size_t end = usage.find('\n', start);
    const size_t stop = end == std::string::npos ? usage.size() : end;
    const std::string line = usage.substr(start, stop - start);
    out += (line.rfind(' ', 0) == 0 ? "             " : "  shardtrain ") + line + "\n";
    start = stop + 1;
  }
  return out;
}

// "error: unknown command `trian`; did you mean `train`? ..." and exit status 2.
int unknown_command(const std::string& name) {
  const Command* near = nearest_command(name);
  std::string line = fmt::format("unknown command `{}`", name);
  if (near != nullptr) line += fmt::format("; did you mean `{}`?", near->name);
  line += " (`shardtrain help` lists the commands)";
  log::error(line);
  return 2;
}

}  // namespace

const std::vector<Command>& commands() { return table(); }

const Command* find_command(const std::string& name) {
  for (const Command& c : table())
    if (name == c.name) return &c;
  return nullptr;
}

const Command* nearest_command(const std::string& name) {
  std::vector<std::string> names;
  for (const Command& c : table()) names.emplace_back(c.name);
  const std::string near = nearest_name(name, names);
  return near.empty() ? nullptr : find_command(near);
}

std::vector<std::string> command_options(const Command& command) {
  std::vector<std::string> options;
  const std::string text = std::string(command.usage) + "\n" + command.details;
  for (size_t i = text.find("--"); i != std::string::npos; i = text.find("--", i + 2)) {
    size_t end = i + 2;
    while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '-')) ++end;
    if (end == i + 2 || (i > 0 && text[i - 1] != ' ' && text[i - 1] != '[' && text[i - 1] != '\n')) continue;
    const std::string option = text.substr(i, end - i);
    if (std::find(options.begin(), options.end(), option) == options.end()) options.push_back(option);
  }
  return options;
}

std::string unknown_option_message(const std::string& command, const std::string& option) {
  // the names other tools give the same thing
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"--max-new-tokens", "--tokens"}, {"--max_new_tokens", "--tokens"}, {"--num-tokens", "--tokens"},
      {"--temp", "--temperature"},      {"--topk", "--top-k"},             {"--topp", "--top-p"},
  };
  const Command* c = find_command(command);
  std::string line = fmt::format("{}: unknown option `{}`", command, option);
  std::string near;
  const std::string name = option.substr(0, option.find('='));
  if (c != nullptr) {
    const std::vector<std::string> options = command_options(*c);
    for (const auto& [alias, ours] : aliases)
      if (name == alias && std::find(options.begin(), options.end(), ours) != options.end()) near = ours;
    if (near.empty()) near = nearest_name(name, options);
  }
  if (!near.empty()) line += fmt::format("; did you mean `{}`?", near);
  return line + fmt::format(" (`shardtrain {} --help` lists its options)", command);
}

std::string overview() {
  std::string out = "usage: shardtrain <command> [options]\n\ncommands:\n";
  for (const Command& c : table()) out += fmt::format("  {:<14}{}\n", c.name, c.summary);
  out += "\n`shardtrain help <command>` or `shardtrain <command> --help`: its usage, options and an example.\n"
         "`shardtrain help config`: every config key. PATH of a tokenizer is a tokenizer.json (or its folder),\n"
         "or `byte` for the byte-level tokenizer.\n";
  return out;
}

std::string command_help(const Command& c) {
  std::string out = "usage:\n" + usage_lines(c.usage);
  out += fmt::format("\n{}.\n\n", c.summary);
  out += c.details;
  if (c.takes_job) out += "\njob options:\n" + std::string(kJobOptions);
  out += fmt::format("\nexample:\n  {}\n", c.example);
  return out;
}

bool asks_for_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "-h" || a == "--help") return true;
  return false;
}

int run_help(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(overview().c_str(), stdout);
    return 0;
  }
  if (args[0] == "config") {  // --markdown: the page docs/configuration.md
    const bool markdown = args.size() > 1 && args[1] == "--markdown";
    std::fputs((markdown ? train::reference_markdown() : train::reference_table()).c_str(), stdout);
    return 0;
  }
  const Command* c = find_command(args[0]);
  if (c == nullptr) return unknown_command(args[0]);
  std::fputs(command_help(*c).c_str(), stdout);
  return 0;
}

int run_command_line(const std::vector<std::string>& all) {
  if (all.empty() || all[0] == "-h" || all[0] == "--help") return run_help({});
  if (all[0] == "--version") return run_version({});
  const Command* c = find_command(all[0]);
  if (c == nullptr) return unknown_command(all[0]);
  const std::vector<std::string> rest(all.begin() + 1, all.end());
  if (asks_for_help(rest)) {
    std::fputs(command_help(*c).c_str(), stdout);
    return 0;
  }
  try {
    return c->run(rest);
  } catch (const UnknownOption& e) {
    throw Error(unknown_option_message(e.command(), e.option()));
  }
}

}  // namespace shardtrain::cli
