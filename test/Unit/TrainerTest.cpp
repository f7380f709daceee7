//===- TrainerTest.cpp - the trainer's paper defaults and data loading ----===//
//
// The per-task defaults are the Spectraformer paper's setup (REFERENCE-NOTES,
// Table 5); the training loop itself is tested end to end by
// test/Tools/spectra-train-*.test (learning, kill-and-resume, errors).
//
//===----------------------------------------------------------------------===//

#include "models/Trainer.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace {
using spectra::models::defaultsFor;

TEST(Trainer, DefaultsAreThePapersPerTaskSetup) {
  struct Row {
    const char *task;
    int64_t batch, warmup, evalEvery, evalBatches, maxLength;
    double lr;
  };
  for (Row r : {Row{"listops", 32, 1000, 500, 62, 2000, 1e-4}, Row{"text", 32, 80, 500, 200, 4000, 1e-4},
                Row{"retrieval", 16, 800, 1000, 300, 4000, 2e-4}}) {
    auto o = defaultsFor(r.task);
    EXPECT_EQ(o.task, r.task);
    EXPECT_EQ(o.batch, r.batch) << r.task;
    EXPECT_EQ(o.warmup, r.warmup) << r.task;
    EXPECT_EQ(o.evalEvery, r.evalEvery) << r.task;
    EXPECT_EQ(o.evalBatches, r.evalBatches) << r.task;
    EXPECT_EQ(o.maxLength, r.maxLength) << r.task;
    EXPECT_DOUBLE_EQ(o.lr, r.lr) << r.task;
    // Shared by the three tasks.
    EXPECT_EQ(o.steps, 50000);
    EXPECT_DOUBLE_EQ(o.clip, 1.0);
    EXPECT_DOUBLE_EQ(o.weightDecay, 0.0);
    EXPECT_EQ(o.seed, 42);
    EXPECT_EQ(o.model.embed, 64);
    EXPECT_EQ(o.model.layers, 2);
    EXPECT_EQ(o.model.heads, 2);
    EXPECT_EQ(o.model.headDim, 32);
    EXPECT_EQ(o.model.ffn, 128);
    EXPECT_DOUBLE_EQ(o.model.dropout, 0.1);
    EXPECT_EQ(o.model.features, 128);
  }
}

TEST(Trainer, UnknownTaskNamesTheValidOnes) {
  try {
    defaultsFor("cifar");
    FAIL() << "no error";
  } catch (const std::invalid_argument &e) {
    EXPECT_STREQ(e.what(), "unknown task 'cifar'; tasks: listops, text, retrieval, lm");
  }
  EXPECT_THROW(spectra::models::loadTask("cifar", "/nonexistent", 10), std::invalid_argument);
}

TEST(Trainer, MissingDataNamesTheFileAndTheLayout) {
  try {
    spectra::models::loadTask("retrieval", "/nonexistent", 10);
    FAIL() << "no error";
  } catch (const std::invalid_argument &e) {
    EXPECT_STREQ(e.what(), "--data /nonexistent: no /nonexistent/new_aan_pairs.train.tsv (LRA's AAN layout)");
  }
}

} // namespace
