//===- spectra-train.cpp - LRA data, training and the sweep ---------------===//
//
//   spectra-train generate-listops --out DIR [...]   LRA's ListOps generator
//   spectra-train [train] --task T --attention A --data DIR [...]
//                                                    one training run
//   spectra-train sweep --task T --data DIR --out DIR [...]
//                                                    the 18 paper variants and
//                                                    softmax, one process each,
//                                                    then the Table 2 layout
//                                                    and the Figure 1 plot
//   spectra-train table --out DIR                    the table and plot again
//   spectra-train plot RUN_DIR... [--out FILE]       learning curves, redrawn
//
//===----------------------------------------------------------------------===//

#include "frontend/OptionText.h"
#include "models/ListOps.h"
#include "models/Sweep.h"
#include "runtime/Paths.h"
#ifdef SPECTRA_TRAIN_WITH_TORCH
#include "models/Distributed.h"
#include "models/Trainer.h"
#include "runtime/CudaDriver.h"
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#endif

#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <vector>
#include <iomanip>
#include <set>
#include <sched.h>
#include <thread>

using namespace spectra::data;

namespace {
/// The whole of `v` as a number (std::stoll / std::stod), or an error naming the option.
template <typename T, typename Parse>
T parseNumber(const std::string &name, const std::string &v, Parse parse, const char *what) {
  size_t used = 0;
  T x{};
  try {
    x = parse(v, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != v.size() || v.empty())
    throw std::invalid_argument("--" + name + " takes " + what + ", got '" + v + "'");
  return x;
}

int64_t toInt(const std::string &name, const std::string &v) {
  return parseNumber<int64_t>(name, v, [](const std::string &s, size_t *n) { return std::stoll(s, n); },
                              "an integer");
}

double toDouble(const std::string &name, const std::string &v) {
  return parseNumber<double>(name, v, [](const std::string &s, size_t *n) { return std::stod(s, n); },
                             "a number");
}

uint64_t toSeed(const std::string &name, const std::string &v) {
  if (!v.empty() && v[0] == '-')
    throw std::invalid_argument("--" + name + " takes a non-negative integer, got '" + v + "'");
  return parseNumber<uint64_t>(name, v,
                               [](const std::string &s, size_t *n) { return std::stoull(s, n); },
                               "a non-negative integer");
}

int generateUsage(std::ostream &os, int code) {
  os << "usage: spectra-train generate-listops --out DIR [--num-train N] [--num-val N] "
        "[--num-test N]\n"
        "                     [--min-length L] [--max-length L] [--seed S]\n"
        "  Generates ListOps with LRA's algorithm (defaults: the official 96000/2000/2000 "
        "examples,\n  500 < length < 2000, seed 42) into DIR/basic_{train,val,test}.tsv.\n";
  return code;
}

const char *kUsage = R"(usage: spectra-train <command> [options]

commands:
  [train] --task T --attention A --data DIR [--out DIR] [options]
        one training run (the command word may be left out)
  sweep --task T --data DIR [--out DIR] [--attentions LIST] [--parallel K] [training options]
        every attention in LIST (default: the paper's 18 variants and softmax; for lm the six
        PosRF ones causal attention accepts, and softmax), each in its own
        process, then the results table and plot; finished runs are kept, interrupted ones resumed.
        --parallel K: K runs at once on each visible GPU (or on the one --device cuda:N names;
        each run pinned to its GPU), or K at once on the CPU; default: as many as the free memory
        holds (a run's peak from the sweep's finished reports, else 3 GiB on a GPU, 2 GiB on the
        CPU), at most one per CPU core. Side by side, each run logs to <run>/train.log and the
        sweep prints a status line a minute; <out>/<task>/sweep-history.jsonl keeps each
        sweep's wall time. --threads (default: the cores shared out) applies to every run.
  table [--out DIR]
        writes DIR/results.{md,csv,png} and DIR/<task>/curves.png (one line per run) from the
        runs under DIR
  plot RUN_DIR [RUN_DIR ...] [--out FILE.png]
        the learning curves of finished or interrupted runs, redrawn from their metrics.jsonl
  generate --checkpoint RUN/best.pt --prompt TEXT [--tokens N] [--temperature T] [--seed S]
        text from a language model (--task lm) with the recurrent state (see 'generate --help')
  generate-listops --out DIR [...]
        LRA's ListOps generator (see 'spectra-train generate-listops --help')

training options (defaults: the paper's setup for the task, REFERENCE-NOTES / Table 5):
  --task listops|text|retrieval|lm  the LRA task, or lm: byte-level next-token prediction on
                                    any text (--data a file or a directory of files) with a
                                    causal decoder; reports bits per byte (defaults: batch 16,
                                    lr 1e-3, warmup 100, 2000 steps, eval every 200 over 20
                                    batches, --max-length 512)
  --attention A                     softmax | spectra:<variant> (fused kernels) |
                                    spectra-reference:<variant> (eager); default spectra:posrf-mm
  --data DIR                        ListOps: basic_{train,val,test}.tsv; Text: aclImdb's
                                    {train,test}/{pos,neg}; Retrieval: new_aan_pairs.*.tsv
  --out DIR                         run directory (default runs/<task>/<attention>)
  --steps N          50000          training steps (early stopping may end sooner)
  --batch N          32/32/16       batch size
  --lr X             1e-4/1e-4/2e-4 peak learning rate (AdamW 0.9/0.999, eps 1e-6)
  --warmup N         1000/80/800    linear warmup steps, then linear decay to 0
  --eval-every N     500/500/1000   steps between evaluations (and checkpoints)
  --eval-batches N   62/200/300     validation batches per evaluation
  --patience N       10             evaluations without improvement before stopping
  --max-length N     2000/4000/4000 tokens kept per document
  --log-every N      100            training-metric window in metrics.jsonl
  --limit-train N    0 (all)        use the first N training examples only
  --time-limit S     0 (none)       train for S seconds, then evaluate, stop and test
  --redraw-every N   0 (never)      draw fresh random features every N steps (Performer's
                                    redraw; fixed recipes only, no recompilation, resumable)
  --option NAME=VALUE                a component or weight-recipe option of the variant
                                    (repeatable), e.g. components=4 for gmm, hidden=32 for
                                    generative, a=-0.2 for gerf
  --clip X 1.0   --weight-decay X 0   --seed N 42
  --features M 128   --embed 64   --layers 2   --heads 2   --head-dim 32   --ffn 128
  --dropout 0.1
  --device auto|cpu|cuda[:N]|gpu-emulated
                                    auto: CUDA when there is one; gpu-emulated: the CPU,
                                    spectra attention through the GPU kernels run on it
  --precision auto|fp32|bf16|fp16   auto: bf16 autocast on CUDA, fp32 on the CPU
  --threads N                       CPU threads (default: torch's)
  --resume                          continue the run in --out from its last checkpoint
  --no-progress                     no progress bar
  --dist-timeout S   300            data parallel: seconds a rank waits for the others (the
                                    rendezvous and every collective) before the run ends
  --grad-sync auto|overlap|after    data parallel: average the gradients during the backward
                                    (c10d's reducer) or after it; auto: overlap on CUDA, after
                                    on the CPU

data parallel (one model on K processes, Gloo on the CPU, NCCL on CUDA with one GPU per
LOCAL_RANK): launch under torchrun, srun or mpirun, which set RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, e.g.
  torchrun --nproc-per-node 2 --no-python spectra-train train --task listops ...
--batch is the global batch (a multiple of the ranks), split over them; rank 0 writes the files.

outputs (in --out): metrics.jsonl, checkpoint.pt (every evaluation), best.pt, report.json,
curves.png (loss and accuracy against steps and time)
)";

int usage(std::ostream &os, int code) {
  os << kUsage;
  return code;
}

int generate(int argc, char **argv) {
  std::map<std::string, std::string> opt = {{"out", ""},         {"num-train", "96000"},
                                            {"num-val", "2000"}, {"num-test", "2000"},
                                            {"min-length", "500"}, {"max-length", "2000"},
                                            {"seed", "42"}};
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h")
      return generateUsage(std::cout, 0);
    if (a.rfind("--", 0) != 0 || !opt.count(a.substr(2)) || i + 1 >= argc) {
      std::cerr << "spectra-train: error: unknown or incomplete option '" << a << "'\n";
      return generateUsage(std::cerr, 2);
    }
    opt[a.substr(2)] = argv[++i];
  }
  if (opt["out"].empty()) {
    std::cerr << "spectra-train: error: generate-listops needs --out DIR\n";
    return generateUsage(std::cerr, 2);
  }
  ListOpsOptions o;
  try {
    o.numTrain = toInt("num-train", opt["num-train"]);
    o.numVal = toInt("num-val", opt["num-val"]);
    o.numTest = toInt("num-test", opt["num-test"]);
    o.minLength = toInt("min-length", opt["min-length"]);
    o.maxLength = toInt("max-length", opt["max-length"]);
    o.seed = toSeed("seed", opt["seed"]);
  } catch (const std::exception &e) {
    std::cerr << "spectra-train: error: " << e.what() << "\n";
    return 2;
  }
  std::string mkdirError;
  if (!spectra::makeDirectories(opt["out"], &mkdirError)) {
    std::cerr << "spectra-train: error: " << mkdirError << "\n";
    return 1;
  }
  auto start = std::chrono::steady_clock::now();
  int64_t lastShown = -1;
  ListOpsSplits s = generateListOps(o, [&](int64_t done, int64_t total) {
    int64_t percent = 100 * done / total;
    if (percent != lastShown && (percent % 5 == 0 || done == total)) {
      lastShown = percent;
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cerr << "\r[spectra-train] generating ListOps: " << done << "/" << total << " ("
                << percent << "%), " << static_cast<int>(elapsed) << " s" << std::flush;
    }
  });
  std::cerr << "\n";
  for (const auto &[name, split] : {std::pair<const char *, const std::vector<ListOpsExample> *>{"train", &s.train},
                                    {"val", &s.val}, {"test", &s.test}}) {
    std::string path = opt["out"] + "/basic_" + name + ".tsv";
    writeListOpsTsv(path, *split);
    std::cout << "wrote " << split->size() << " examples to " << path << "\n";
  }
  return 0;
}
#ifdef SPECTRA_TRAIN_WITH_TORCH
using spectra::models::TrainOptions;
using json = nlohmann::json;

struct Args {
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  std::vector<std::string> variantOptions;  ///< --option NAME=VALUE, in order
};

const std::set<std::string> kValueOptions = {
    "task",        "attention",    "data",         "out",      "steps",    "batch",
    "lr",          "warmup",       "eval-every",   "eval-batches", "patience", "max-length",
    "log-every",   "limit-train",  "clip",         "weight-decay", "seed",   "features",
    "embed",       "layers",       "heads",        "head-dim", "ffn",      "dropout",
    "device",      "precision",    "time-limit",    "threads",      "kill-after-step", "attentions",
    "redraw-every", "option",      "parallel",     "dist-timeout", "kill-rank",
    "grad-sync"};
const std::set<std::string> kFlags = {"resume", "no-progress"};

/// --name value pairs and flags; an unknown or valueless option is an error naming it.
Args parseArgs(int argc, char **argv, int first) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0)
      throw std::invalid_argument("unexpected argument '" + s + "' (options are --name value)");
    std::string name = s.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos)
      value = name.substr(eq + 1), name = name.substr(0, eq);
    if (kFlags.count(name)) {
      if (eq != std::string::npos)
        throw std::invalid_argument("option '--" + name + "' takes no value");
      a.flags.insert(name);
      continue;
    }
    if (!kValueOptions.count(name))
      throw std::invalid_argument("unknown option '--" + name + "' (see spectra-train --help)");
    if (eq == std::string::npos) {
      if (i + 1 >= argc)
        throw std::invalid_argument("option '--" + name + "' needs a value");
      value = argv[++i];
    }
    if (name == "option")
      a.variantOptions.push_back(value);
    else
      a.values[name] = value;
  }
  return a;
}

std::string runName(const std::string &attention) {
  std::string s = attention;
  std::replace(s.begin(), s.end(), ':', '-');
  return s;
}

TrainOptions optionsFrom(const Args &a) {
  auto get = [&](const char *k) { return a.values.count(k) ? a.values.at(k) : std::string(); };
  std::string task = get("task");
  if (task.empty())
    throw std::invalid_argument("--task is required: listops, text or retrieval");
  TrainOptions o = spectra::models::defaultsFor(task);
  if (!get("attention").empty())
    o.attention = get("attention");
  o.data = get("data");
  if (o.data.empty())
    throw std::invalid_argument("--data DIR is required (the task's data in LRA's layout)");
  o.out = get("out").empty() ? "runs/" + task + "/" + runName(o.attention) : get("out");
  std::map<std::string, int64_t *> ints = {
      {"steps", &o.steps},          {"batch", &o.batch},          {"warmup", &o.warmup},
      {"eval-every", &o.evalEvery}, {"eval-batches", &o.evalBatches}, {"patience", &o.patience},
      {"max-length", &o.maxLength}, {"log-every", &o.logEvery},   {"limit-train", &o.limitTrain},
      {"seed", &o.seed},            {"features", &o.model.features}, {"embed", &o.model.embed},
      {"layers", &o.model.layers},  {"heads", &o.model.heads},    {"head-dim", &o.model.headDim},
      {"ffn", &o.model.ffn},        {"kill-after-step", &o.killAfterStep},
      {"redraw-every", &o.redrawEvery}, {"dist-timeout", &o.distTimeout},
      {"kill-rank", &o.killRank}};
  std::map<std::string, double *> doubles = {{"lr", &o.lr},
                                             {"clip", &o.clip},
                                             {"weight-decay", &o.weightDecay},
                                             {"dropout", &o.model.dropout},
                                             {"time-limit", &o.timeLimit}};
  for (auto &[k, v] : a.values) {
    if (ints.count(k))
      *ints[k] = toInt(k, v);
    else if (doubles.count(k))
      *doubles[k] = toDouble(k, v);
  }
  if (!get("device").empty())
    o.device = get("device");
  if (!get("precision").empty())
    o.precision = get("precision");
  if (!get("grad-sync").empty())
    o.gradSync = get("grad-sync");
  if (!get("threads").empty())
    torch::set_num_threads(static_cast<int>(toInt("threads", get("threads"))));
  for (const std::string &kv : a.variantOptions)
    if (std::string error = ::spectra::parseOption(kv, o.model.options); !error.empty())
      throw std::invalid_argument("--option " + error);
  o.resume = a.flags.count("resume") > 0;
  o.progress = a.flags.count("no-progress") == 0;
  return o;
}

std::string gib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < (int64_t(1) << 30) ? 3 : 2) << bytes / 1073741824.0;
  return os.str();
}

std::string formatted(double x, int digits);
void drawCurves(const std::string &png, const std::vector<std::string> &runs);

int trainCommand(int argc, char **argv, int first) {
  Args a = parseArgs(argc, argv, first);
  for (const char *only : {"attentions", "parallel"})
    if (a.values.count(only))
      throw std::invalid_argument(std::string("--") + only + " belongs to 'spectra-train sweep'");
  TrainOptions o = optionsFrom(a);
  auto r = spectra::models::train(o, std::cerr);
  if (r.rank != 0)
    return 0;  // rank 0 reports for the ranks
  std::cout << std::fixed << std::setprecision(4) << "\n== " << o.task << " / " << o.attention
            << " ==\n"
            << "test accuracy     " << r.testAccuracy
            << (r.bestStep > 0 ? "  (best checkpoint, step " + std::to_string(r.bestStep)
                               : std::string("  (no evaluation before the end: the final model"))
            << "; majority-class baseline " << r.majorityBaseline << ")\n"
            << "best validation   "
            << (r.bestValAccuracy >= 0 ? formatted(r.bestValAccuracy, 4) : std::string("none")) << "\n"
            << "steps             " << r.steps << (r.earlyStopped ? " (stopped early)" : r.timeLimited ? " (time limit)" : "")
            << (r.divergedAt ? " (diverged at step " + std::to_string(r.divergedAt) + ")" : "")
            << (r.skippedSteps ? ", " + std::to_string(r.skippedSteps) + " non-finite updates skipped" : "") << ", "
            << std::setprecision(2) << r.stepsPerSecond << " steps/s\n"
            << "training time     " << std::setprecision(1) << r.trainSeconds << " s\n"
            << "peak memory       " << gib(r.peakBytes) << " GiB (" << r.peakKind << ")\n"
            << "device            " << r.device << ", " << r.precision
            << (r.worldSize > 1 ? ", " + std::to_string(r.worldSize) + " ranks (" + r.backend + ")" : "")
            << "\n"
            << "outputs           " << o.out << "/{metrics.jsonl,report.json,best.pt,checkpoint.pt}\n";
  drawCurves(o.out + "/curves.png", {o.out});
  std::cout << "curves            " << o.out << "/curves.png\n";
  return 0;
}

// --- the sweep and its table ----------------------------------------------------------------

const char *kComponents[] = {"posrf", "oprf", "saderf"};
const char *kWeights[] = {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"};
const char *kTasks[] = {"listops", "text", "retrieval"};

std::vector<std::string> paperAttentions() {
  std::vector<std::string> v = {"softmax"};
  for (auto *c : kComponents)
    for (auto *w : kWeights)
      v.push_back(std::string("spectra:") + c + "-" + w);
  return v;
}

/// The paper's variants that causal attention accepts (PosRF's six: OPRF and SADERF read
/// sequence statistics) and softmax: the lm task's default sweep.
std::vector<std::string> causalAttentions() {
  std::vector<std::string> v = {"softmax"};
  for (auto *w : kWeights)
    v.push_back(std::string("spectra:posrf-") + w);
  return v;
}

bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string selfPath() {
  char buffer[4096];
  ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0)
    throw std::runtime_error("cannot find this program's path (/proc/self/exe)");
  buffer[n] = 0;
  return buffer;
}

/// Runs argv as a child process (its output goes to ours) and returns its exit status: a queue
/// of one job on one slot.
int runChild(const std::vector<std::string> &args) {
  return spectra::sweep::runQueue({{args[0], args, ""}}, {{"", "", {}}}).outcomes[0].exitCode;
}

/// Learning curves of `runs` into `png` (spectra-plot-curves.py beside this program); a
/// warning, never a failure, when it cannot be drawn.
void drawCurves(const std::string &png, const std::vector<std::string> &runs) {
  std::string exe = selfPath();
  std::string script = exe.substr(0, exe.rfind('/')) + "/spectra-plot-curves.py";
  if (!exists(script)) {
    std::cerr << "spectra-train: warning: " << script << " is missing; no curves\n";
    return;
  }
  std::vector<std::string> args = {"/usr/bin/env", "python3", script, png};
  args.insert(args.end(), runs.begin(), runs.end());
  if (int rc = runChild(args); rc != 0)
    std::cerr << "spectra-train: warning: the curves were not drawn (" << script << " exited " << rc
              << ")\n";
}

struct Row {
  std::map<std::string, json> byTask;  ///< task -> report.json
};

std::pair<std::string, std::string> splitAttention(const std::string &attention) {
  size_t colon = attention.find(':');
  if (colon == std::string::npos)
    return {attention, ""};
  std::string v = attention.substr(colon + 1);
  for (auto *c : kComponents)
    for (auto *w : kWeights)
      if (v == std::string(c) + "-" + w)
        return {c, w};
  size_t dash = v.find('-');
  return {v.substr(0, dash), dash == std::string::npos ? "" : v.substr(dash + 1)};
}

int attentionRank(const std::string &attention) {
  auto all = paperAttentions();
  auto it = std::find(all.begin(), all.end(), attention);
  return it == all.end() ? 1000 : static_cast<int>(it - all.begin());
}

std::string formatted(double x, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << x;
  return os.str();
}

/// results.md (the paper's Table 2 layout: accuracy, time, memory per task and their average),
/// results.csv (one line per run) and results.png (Figure 1: memory vs accuracy, colour = time).
/// The attentions of a table (the keys of `byAttention`) in the table's order: softmax, then
/// the paper's variants, then the rest.
template <typename Map>
std::vector<std::string> tableOrder(const Map &byAttention) {
  std::vector<std::string> order;
  for (auto &entry : byAttention)
    order.push_back(entry.first);
  std::stable_sort(order.begin(), order.end(), [](const std::string &x, const std::string &y) {
    return std::make_pair(attentionRank(x), x) < std::make_pair(attentionRank(y), y);
  });
  return order;
}

/// The reports of `task`'s runs under `out` (report.json of each run directory), by attention;
/// the run directories go to `runDirs` (for the curves).
std::map<std::string, json> reportsOf(const std::string &out, const std::string &task,
                                      std::vector<std::string> &runDirs) {
  std::map<std::string, json> byAttention;
  std::string dir = out + "/" + task;
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return byAttention;
  while (dirent *e = ::readdir(d)) {
    std::string report = dir + "/" + e->d_name + "/report.json";
    if (e->d_name[0] == '.' || !exists(report))
      continue;
    runDirs.push_back(dir + "/" + e->d_name);
    std::ifstream in(report);
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("attention")) {
      std::cerr << "spectra-train: warning: " << report << " is not a report; skipped\n";
      continue;
    }
    byAttention[j["attention"].get<std::string>()] = j;
  }
  ::closedir(d);
  return byAttention;
}

/// The language-modelling runs (task lm) under `out`: lm-results.md (test bits per byte,
/// next-byte accuracy, steps, steps/s, time, memory) and lm/curves.png. Returns
/// whether there were any.
bool writeLmTable(const std::string &out) {
  std::vector<std::string> dirs;
  std::map<std::string, json> runs = reportsOf(out, "lm", dirs);
  if (runs.empty())
    return false;
  std::vector<std::string> order = tableOrder(runs);
  std::ofstream md(out + "/lm-results.md");
  md << "# Byte-level language modelling (spectra-train --task lm)\n\n"
     << "Bits per byte and next-byte accuracy on the test windows with the best validation "
        "checkpoint; training time, steps/s and peak memory (GB) of each run.\n\n"
     << "| attention | test bits/byte | next-byte acc (%) | steps | steps/s | time (h) | mem (GB) |\n"
     << "|---|---:|---:|---:|---:|---:|---:|\n";
  for (auto &a : order) {
    json &j = runs[a];
    md << "| " << a << " | " << formatted(j.value("test_bits_per_byte", 0.0), 3) << " | "
       << formatted(100 * j["test_accuracy"].get<double>(), 2) << " | " << j["steps"].get<int64_t>()
       << " | " << formatted(j["steps_per_second"].get<double>(), 2) << " | "
       << formatted(j["train_seconds"].get<double>() / 3600, 4) << " | "
       << formatted(j["peak_bytes"].get<double>() / 1e9, 2) << " |\n";
  }
  md.close();
  std::sort(dirs.begin(), dirs.end());
  drawCurves(out + "/lm/curves.png", dirs);
  std::cout << "wrote " << out << "/lm-results.md (" << order.size() << " language model(s))"
            << std::endl;
  return true;
}

int writeTable(const std::string &out) {
  bool languageModels = writeLmTable(out);
  std::map<std::string, Row> rows;
  std::vector<std::string> tasks;
  std::map<std::string, std::vector<std::string>> runDirs;  // task -> its runs (for the curves)
  for (auto *task : kTasks) {
    auto reports = reportsOf(out, task, runDirs[task]);
    for (auto &[attention, j] : reports)
      rows[attention].byTask[task] = j;
    if (!reports.empty())
      tasks.push_back(task);
    if (runDirs[task].empty())
      runDirs.erase(task);
  }
  if (rows.empty()) {
    if (languageModels)
      return 0;
    std::cerr << "spectra-train: error: no finished runs (report.json) under " << out
              << "/{listops,text,retrieval,lm}/\n";
    return 1;
  }
  std::vector<std::string> order = tableOrder(rows);

  std::ofstream csv(out + "/results.csv");
  csv << "task,attention,component,weights,test_accuracy,best_val_accuracy,train_seconds,"
         "peak_bytes,peak_kind,steps,early_stopped,time_limited,diverged_at,device,precision,"
         "majority_baseline\n";
  for (auto &a : order)
    for (auto &t : tasks)
      if (rows[a].byTask.count(t)) {
        json &j = rows[a].byTask[t];
        auto [c, w] = splitAttention(a);
        csv << t << "," << a << "," << c << "," << w << "," << j["test_accuracy"].get<double>() << ","
            << j["best_val_accuracy"].get<double>() << "," << j["train_seconds"].get<double>() << ","
            << j["peak_bytes"].get<int64_t>() << "," << j["peak_kind"].get<std::string>() << ","
            << j["steps"].get<int64_t>() << "," << (j["early_stopped"].get<bool>() ? 1 : 0) << ","
            << (j.value("time_limited", false) ? 1 : 0) << "," << j.value("diverged_at", int64_t(0)) << ","
            << j["device"].get<std::string>() << "," << j["precision"].get<std::string>() << ","
            << j.value("majority_baseline", -1.0) << "\n";
      }
  csv.close();

  std::map<std::string, const char *> shortName = {{"listops", "L"}, {"text", "T"}, {"retrieval", "R"}};
  std::ofstream md(out + "/results.md");
  md << "# LRA results (layout of the Spectraformer paper's Table 2)\n\n"
     << "Accuracy (%) on the test split with the best validation checkpoint, training time (h) and "
        "peak memory (GB: the CUDA allocator's peak on a GPU, the process's peak RSS on the CPU). "
        "L = ListOps, T = Text, R = Retrieval; Avg over the tasks present.\n\n";
  md << "| Component | Weights |";
  for (const char *group : {"Acc", "Time (h)", "Mem (GB)"}) {
    for (auto &t : tasks)
      md << " " << group << " " << shortName[t] << " |";
    md << " " << group << " Avg |";
  }
  md << "\n|---|---|";
  for (int g = 0; g < 3; ++g)
    for (size_t i = 0; i <= tasks.size(); ++i)
      md << "---:|";
  md << "\n";
  for (auto &a : order) {
    auto [c, w] = splitAttention(a);
    if (a.rfind("spectra-reference:", 0) == 0)
      c += " (reference)";
    md << "| " << c << " | " << (w.empty() ? "-" : w) << " |";
    struct G {
      const char *key;
      double scale;
      int digits;
    };
    for (G g : {G{"test_accuracy", 100.0, 2}, G{"train_seconds", 1 / 3600.0, 2},
                G{"peak_bytes", 1 / 1e9, 2}}) {
      double sum = 0;
      size_t n = 0;
      for (auto &t : tasks) {
        if (!rows[a].byTask.count(t)) {
          md << " - |";
          continue;
        }
        double x = rows[a].byTask[t][g.key].get<double>() * g.scale;
        sum += x, ++n;
        bool diverged = rows[a].byTask[t].value("diverged_at", int64_t(0)) > 0;
        md << " " << formatted(x, g.key == std::string("train_seconds") && x < 0.01 ? 4 : g.digits)
           << (diverged && g.key == std::string("test_accuracy") ? "*" : "") << " |";
      }
      md << " " << (n == tasks.size() ? formatted(sum / n, g.digits) : "-") << " |";
    }
    md << "\n";
  }
  md << "\nRuns: ";
  std::set<std::string> devices;
  for (auto &a : order)
    for (auto &[t, j] : rows[a].byTask)
      devices.insert(j["device"].get<std::string>() + " " + j["precision"].get<std::string>());
  bool first = true;
  for (auto &d : devices)
    md << (first ? "" : "; ") << d, first = false;
  md << " (steps, early stopping and the time limit of each run: results.csv).\n";
  bool anyDiverged = false;
  for (auto &a : order)
    for (auto &[t, j] : rows[a].byTask)
      anyDiverged = anyDiverged || j.value("diverged_at", int64_t(0)) > 0;
  if (anyDiverged)
    md << "\n\\* diverged (non-finite loss or gradients "
       << spectra::models::kDivergedAfterNonFiniteSteps
     << " steps in a row, at the step in results.csv); its best checkpoint before that was "
        "tested.\n";
  md.close();
  std::cout << "wrote " << out << "/results.md and " << out << "/results.csv (" << order.size()
            << " attentions x " << tasks.size() << " task(s))" << std::endl;

  std::string exe = selfPath();
  std::string script = exe.substr(0, exe.rfind('/')) + "/spectra-plot-sweep.py";
  if (!exists(script)) {
    std::cerr << "spectra-train: warning: " << script << " is missing; no plot\n";
    return 0;
  }
  int rc = runChild({"/usr/bin/env", "python3", script, out + "/results.csv", out + "/results.png"});
  if (rc != 0)
    std::cerr << "spectra-train: warning: the plot was not written (" << script << " exited " << rc << ")\n";
  // One figure per task with every run's curves, one line per attention.
  for (auto &[task, dirs] : runDirs) {
    std::sort(dirs.begin(), dirs.end());
    drawCurves(out + "/" + task + "/curves.png", dirs);
  }
  return 0;
}

/// "step N" from the last record of a run's metrics.jsonl ("" before the first).
std::string lastStep(const std::string &dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty())
      last = line;
  json j = json::parse(last, nullptr, false);
  if (j.is_discarded() || !j.contains("step"))
    return "";
  return "step " + std::to_string(j["step"].get<int64_t>());
}

/// The largest peak of the task's finished runs under `out` on the same kind of device (0 when
/// there is none): what the next runs of the sweep are planned with.
int64_t observedRunBytes(const std::string &out, const std::string &task, bool cuda) {
  int64_t peak = 0;
  std::string dir = out + "/" + task;
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return 0;
  while (dirent *e = ::readdir(d)) {
    if (e->d_name[0] == '.')
      continue;
    std::ifstream in(dir + "/" + e->d_name + "/report.json");
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("peak_bytes") || !j.contains("device"))
      continue;
    if ((j["device"].get<std::string>().rfind("cuda", 0) == 0) == cuda)
      peak = std::max(peak, j["peak_bytes"].get<int64_t>());
  }
  ::closedir(d);
  return peak;
}

int cpuCores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int sweepCommand(int argc, char **argv) {
  Args a = parseArgs(argc, argv, 2);
  // Under a launcher every rank would run the whole sweep, and each run would join the ranks.
  if (int64_t ranks = spectra::models::readDistributedEnvironment().worldSize; ranks > 1)
    throw std::invalid_argument("sweep is started once, not under torchrun, srun or mpirun (WORLD_SIZE=" +
                                std::to_string(ranks) + " here): it runs independent runs side by side; "
                                "for a sweep of data-parallel runs, launch each run with torchrun "
                                "(README: Data parallel)");
  if (!a.values.count("task") || !a.values.count("data"))
    throw std::invalid_argument("sweep needs --task and --data (see spectra-train --help)");
  if (a.values.count("attention"))
    throw std::invalid_argument("sweep takes --attentions LIST (comma-separated), not --attention");
  std::string task = a.values["task"];
  spectra::models::defaultsFor(task);  // validates the task name
  std::string out = a.values.count("out") ? a.values["out"] : "runs/sweep";
  std::vector<std::string> attentions;
  if (!a.values.count("attentions") || a.values["attentions"] == "paper") {
    attentions = task == "lm" ? causalAttentions() : paperAttentions();
  } else {
    std::stringstream list(a.values["attentions"]);
    std::string item;
    while (std::getline(list, item, ','))
      if (!item.empty() && std::find(attentions.begin(), attentions.end(), item) == attentions.end())
        attentions.push_back(item);
  }

  // Where the runs go: --parallel K runs at once per device (K from the memory when not given),
  // over every visible GPU (or the one --device names), else over the CPU's cores.
  namespace sweep = spectra::sweep;
  sweep::Request request;
  request.device = a.values.count("device") ? a.values["device"] : "auto";
  if (a.values.count("parallel")) {
    int64_t k = toInt("parallel", a.values["parallel"]);
    if (k < 1)
      throw std::invalid_argument("--parallel must be at least 1, got " + a.values["parallel"]);
    request.parallel = static_cast<int>(k);
  }
  if (a.values.count("threads"))
    request.threads = toInt("threads", a.values["threads"]);
  request.runs = attentions.size();
  sweep::Resources resources;
  resources.cpuCores = cpuCores();
  resources.hostAvailableBytes = sweep::hostAvailableBytes();
  if (request.device != "cpu") {
    const char *visible = std::getenv("CUDA_VISIBLE_DEVICES");
    auto devices = spectra::cuda::devices();
    for (size_t i = 0; i < devices.size(); ++i)
      resources.gpus.push_back({static_cast<int>(i), sweep::visibleIdOf(static_cast<int>(i), visible),
                                devices[i].name, devices[i].freeBytes, devices[i].totalBytes});
  }
  bool onGpu = request.device != "cpu" && !resources.gpus.empty();
  request.runBytes = observedRunBytes(out, task, onGpu);
  sweep::Plan plan = sweep::plan(resources, request);
  bool several = plan.slots.size() > 1;
  std::cerr << "[sweep] " << attentions.size() << " run(s) of " << task << " into " << out << "/" << task
            << ": " << plan.explanation
            << (request.runBytes > 0 ? " (run peak from the finished runs' reports)" : "") << "\n";
  for (auto &w : plan.warnings)
    std::cerr << "[sweep] warning: " << w << "\n";

  std::string exe = selfPath();
  std::vector<sweep::Job> jobs;
  for (const std::string &attention : attentions) {
    std::string dir = out + "/" + task + "/" + runName(attention);
    sweep::Job job{attention, {exe, "train", "--attention", attention, "--out", dir}, ""};
    for (auto &[k, v] : a.values)
      if (k != "attentions" && k != "out" && k != "parallel" && k != "device" && k != "threads")
        job.argv.push_back("--" + k), job.argv.push_back(v);
    for (const std::string &kv : a.variantOptions)
      job.argv.push_back("--option"), job.argv.push_back(kv);
    for (auto &f : a.flags)
      if (f != "resume" && f != "no-progress")
        job.argv.push_back("--" + f);
    // Runs side by side write to their own logs, without progress bars.
    if (several || a.flags.count("no-progress"))
      job.argv.push_back("--no-progress");
    if (several) {
      std::string error;
      if (!spectra::makeDirectories(dir, &error))
        throw std::runtime_error(error);
      job.logPath = dir + "/train.log";
    }
    // A run with a checkpoint resumes (the trainer refuses other options, keeps a finished
    // run's report and continues an interrupted one); delete its directory to train it again.
    if (exists(dir + "/checkpoint.pt") || exists(dir + "/metrics.jsonl"))
      job.argv.push_back("--resume");
    jobs.push_back(std::move(job));
  }
  sweep::QueueCallbacks callbacks;
  callbacks.say = [](const std::string &line) { std::cerr << "[sweep] " << line << std::endl; };
  callbacks.progress = [&](size_t j) { return lastStep(out + "/" + task + "/" + runName(attentions[j])); };
  callbacks.statusEverySeconds = several && !a.flags.count("no-progress") ? 60 : 0;
  sweep::QueueResult result = sweep::runQueue(jobs, plan.slots, callbacks);

  std::vector<std::string> failed;
  json record = {{"task", task},
                 {"runs", attentions.size()},
                 {"slots", json::array()},
                 {"parallel_per_device", plan.perDevice},
                 {"threads_per_run", plan.threadsPerRun},
                 {"max_concurrent", result.maxConcurrent},
                 {"wall_seconds", result.seconds},
                 {"interrupted", result.interrupted},
                 {"outcomes", json::array()}};
  for (auto &slot : plan.slots)
    record["slots"].push_back(slot.label);
  for (auto &o : result.outcomes) {
    record["outcomes"].push_back({{"attention", o.name}, {"slot", o.slot}, {"exit", o.exitCode}, {"seconds", o.seconds}});
    if (o.exitCode > 0)
      failed.push_back(o.name);
  }
  {
    std::string error;
    if (spectra::makeDirectories(out + "/" + task, &error)) {
      std::ofstream history(out + "/" + task + "/sweep-history.jsonl", std::ios::app);
      history << record.dump() << "\n";
    }
  }
  std::cerr << "[sweep] " << std::fixed << std::setprecision(1);
  if (result.interrupted)
    std::cerr << "interrupted after " << result.seconds << " s";
  else
    std::cerr << "done: " << attentions.size() << " run(s) in " << result.seconds << " s, "
              << result.maxConcurrent << " at most at once (" << std::setprecision(2)
              << (result.seconds > 0 ? 3600.0 * attentions.size() / result.seconds : 0) << " runs/h)";
  std::cerr << "; history in " << out << "/" << task << "/sweep-history.jsonl" << std::endl;
  if (result.interrupted)
    return 130;
  int rc = writeTable(out);
  if (!failed.empty()) {
    std::cerr << "spectra-train: " << failed.size() << " run(s) failed:";
    for (auto &f : failed)
      std::cerr << " " << f;
    std::cerr << " (rerun the same sweep to retry them; finished runs are kept)\n";
    return 1;
  }
  return rc;
}

/// spectra-train plot RUN_DIR... [--out FILE]: the learning curves of finished or interrupted
/// runs, redrawn from their metrics.jsonl (one run: RUN_DIR/curves.png by default).
int plotCommand(int argc, char **argv) {
  std::vector<std::string> runs;
  std::string png;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: spectra-train plot RUN_DIR [RUN_DIR ...] [--out FILE.png]\n"
                   "  the learning curves of runs (one line per run), from their metrics.jsonl;\n"
                   "  default --out: RUN_DIR/curves.png for one run, curves.png for several\n";
      return 0;
    }
    if (arg == "--out") {
      if (i + 1 >= argc)
        throw std::invalid_argument("--out needs a file name");
      png = argv[++i];
    } else if (arg.rfind("--", 0) == 0) {
      throw std::invalid_argument("unknown option '" + arg + "' for plot (--out FILE)");
    } else {
      if (!exists(arg + "/metrics.jsonl"))
        throw std::invalid_argument("'" + arg + "' is not a run directory (no metrics.jsonl)");
      runs.push_back(arg);
    }
  }
  if (runs.empty())
    throw std::invalid_argument("plot needs at least one run directory (spectra-train plot --help)");
  if (png.empty())
    png = runs.size() == 1 ? runs[0] + "/curves.png" : "curves.png";
  drawCurves(png, runs);
  return exists(png) ? 0 : 1;
}

int tableCommand(int argc, char **argv) {
  Args a = parseArgs(argc, argv, 2);
  return writeTable(a.values.count("out") ? a.values["out"] : "runs/sweep");
}

const char *kGenerateUsage =
    "usage: spectra-train generate --checkpoint RUN/best.pt --prompt TEXT [--tokens 200]\n"
    "                              [--temperature 0.8] [--seed 0]\n"
    "  text from a language model (a run of --task lm): the prompt, then --tokens bytes sampled\n"
    "  at --temperature (0: the most likely byte), one recurrent step per token (spectral\n"
    "  attention: a state of m x (d + 2) per head, O(m d) per token whatever the length;\n"
    "  softmax attention recomputes the prefix). Prints the text, then the tokens/s (stderr).\n";

int generateTextCommand(int argc, char **argv) {
  spectra::models::GenerateOptions o;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      std::cout << kGenerateUsage;
      return 0;
    }
    if (i + 1 >= argc || (s != "--checkpoint" && s != "--prompt" && s != "--tokens" &&
                          s != "--temperature" && s != "--seed"))
      throw std::invalid_argument("generate: unknown or incomplete option '" + s + "'\n" +
                                  kGenerateUsage);
    std::string v = argv[++i];
    if (s == "--checkpoint")
      o.checkpoint = v;
    else if (s == "--prompt")
      o.prompt = v;
    else if (s == "--tokens")
      o.tokens = toInt("tokens", v);
    else if (s == "--temperature")
      o.temperature = toDouble("temperature", v);
    else
      o.seed = toSeed("seed", v);
  }
  if (o.checkpoint.empty() || o.prompt.empty())
    throw std::invalid_argument(std::string("generate needs --checkpoint and --prompt\n") +
                                kGenerateUsage);
  if (o.tokens < 0)
    throw std::invalid_argument("generate: --tokens must be >= 0");
  spectra::models::GenerateResult r = spectra::models::generateText(o);
  std::cout << r.text << std::endl;
  std::cerr << "generated " << r.generated << " tokens after a " << r.promptTokens
            << "-token prompt in " << std::fixed << std::setprecision(3) << r.seconds << " s: "
            << std::setprecision(1) << (r.promptTokens + r.generated) / std::max(1e-9, r.seconds)
            << " tokens/s (" << r.attention
            << (r.attention == "softmax" ? ", the prefix recomputed per token"
                                         : ", one recurrent step per token")
            << ")\n";
  return 0;
}
#endif
} // namespace

int main(int argc, char **argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")
    return usage(argc < 2 ? std::cerr : std::cout, argc < 2 ? 2 : 0);
  std::string command = argv[1];
  // --help after any command: that command's usage (train and sweep share the training
  // options, listed in the full usage).
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      if (command == "table") {
        std::cout << "usage: spectra-train table [--out DIR]\n"
                     "  writes DIR/results.{md,csv,png} and DIR/<task>/curves.png from the runs "
                     "under DIR\n  (default runs/sweep)\n";
        return 0;
      }
      if (command == "train" || command == "sweep" || command.rfind("--", 0) == 0)
        return usage(std::cout, 0);
      break;  // generate-listops, generate and plot answer --help themselves
    }
  try {
    if (command == "generate-listops")
      return generate(argc, argv);
#ifdef SPECTRA_TRAIN_WITH_TORCH
    if (command == "train")
      return trainCommand(argc, argv, 2);
    if (command.rfind("--", 0) == 0)
      return trainCommand(argc, argv, 1);
    if (command == "sweep")
      return sweepCommand(argc, argv);
    if (command == "table")
      return tableCommand(argc, argv);
    if (command == "generate")
      return generateTextCommand(argc, argv);
    if (command == "plot")
      return plotCommand(argc, argv);
#else
    if (command == "train" || command == "sweep" || command == "table" || command == "plot" ||
        command.rfind("--", 0) == 0) {
      std::cerr << "spectra-train: error: this build has no LibTorch (SPECTRA_ENABLE_TORCH=OFF); "
                   "only generate-listops is available\n";
      return 2;
    }
#endif
    std::cerr << "spectra-train: error: unknown command '" << command
              << "'; commands: train, sweep, table, plot, generate, generate-listops\n";
    return usage(std::cerr, 2);
  } catch (const std::invalid_argument &e) {
    std::cerr << "spectra-train: error: " << e.what() << "\n";
    return 2;
#ifdef SPECTRA_TRAIN_WITH_TORCH
  } catch (const c10::Error &e) {
    std::cerr << "spectra-train: error: " << e.what_without_backtrace() << "\n";
    return 1;
#endif
  } catch (const std::exception &e) {
    std::cerr << "spectra-train: error: " << e.what() << "\n";
    return 1;
  }
}
