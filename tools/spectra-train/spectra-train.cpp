//===- spectra-train.cpp - LRA data and training --------------------------===//
//
//   spectra-train generate-listops --out DIR [--num-train 96000 --num-val 2000
//                 --num-test 2000 --min-length 500 --max-length 2000 --seed 42]
//
// Writes DIR/basic_{train,val,test}.tsv in LRA's layout. Training
// (--task listops|text|retrieval) and the sweep arrive with the rest of the
// LRA training issue.
//
//===----------------------------------------------------------------------===//

#include "models/ListOps.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <sys/stat.h>

using namespace spectra::data;

namespace {
int usage(std::ostream &os, int code) {
  os << "usage: spectra-train generate-listops --out DIR [--num-train N] [--num-val N] "
        "[--num-test N]\n"
        "                     [--min-length L] [--max-length L] [--seed S]\n"
        "  Generates ListOps with LRA's algorithm (defaults: the official 96000/2000/2000 "
        "examples,\n  500 < length < 2000, seed 42) into DIR/basic_{train,val,test}.tsv.\n";
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
      return usage(std::cout, 0);
    if (a.rfind("--", 0) != 0 || !opt.count(a.substr(2)) || i + 1 >= argc) {
      std::cerr << "spectra-train: error: unknown or incomplete option '" << a << "'\n";
      return usage(std::cerr, 2);
    }
    opt[a.substr(2)] = argv[++i];
  }
  if (opt["out"].empty()) {
    std::cerr << "spectra-train: error: generate-listops needs --out DIR\n";
    return usage(std::cerr, 2);
  }
  ListOpsOptions o;
  try {
    o.numTrain = std::stoll(opt["num-train"]);
    o.numVal = std::stoll(opt["num-val"]);
    o.numTest = std::stoll(opt["num-test"]);
    o.minLength = std::stoll(opt["min-length"]);
    o.maxLength = std::stoll(opt["max-length"]);
    o.seed = std::stoull(opt["seed"]);
  } catch (const std::exception &) {
    std::cerr << "spectra-train: error: the numeric options take integers\n";
    return 2;
  }
  if (mkdir(opt["out"].c_str(), 0755) != 0 && errno != EEXIST) {
    std::cerr << "spectra-train: error: cannot create '" << opt["out"] << "': " << std::strerror(errno)
              << "\n";
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
} // namespace

int main(int argc, char **argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")
    return usage(argc < 2 ? std::cerr : std::cout, argc < 2 ? 2 : 0);
  try {
    if (std::string(argv[1]) == "generate-listops")
      return generate(argc, argv);
    std::cerr << "spectra-train: error: unknown command '" << argv[1]
              << "'; commands: generate-listops (training and the sweep are not in this build yet)\n";
    return 2;
  } catch (const std::exception &e) {
    std::cerr << "spectra-train: error: " << e.what() << "\n";
    return 1;
  }
}
