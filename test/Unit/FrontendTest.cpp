//===- FrontendTest.cpp - variant names, plans and the IR they build -----===//

#include "dialect/SpectraDialect.h"
#include "frontend/Variant.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include "frontend/OptionText.h"

#include <gtest/gtest.h>

using namespace spectra::frontend;

namespace {

std::string errorOf(llvm::Error err) { return llvm::toString(std::move(err)); }

TEST(VariantName, ParsesEveryPaperVariant) {
  std::vector<Variant> paper = paperVariants();
  ASSERT_EQ(paper.size(), 18u);
  for (const Variant &v : paper) {
    llvm::Expected<Variant> parsed = parseVariantName(v.name());
    ASSERT_TRUE(static_cast<bool>(parsed)) << errorOf(parsed.takeError());
    EXPECT_EQ(parsed->component, v.component);
    EXPECT_EQ(parsed->weights, v.weights);
    EXPECT_TRUE(parsed->isPaperVariant()) << v.name();
  }
}

TEST(VariantName, HyphenatedComponentsAndWeights) {
  auto v = parseVariantName("posrf-hyp-qmc-sobol");
  ASSERT_TRUE(static_cast<bool>(v)) << errorOf(v.takeError());
  EXPECT_EQ(v->component, "posrf-hyp");
  EXPECT_EQ(v->weights, "qmc-sobol");
  EXPECT_EQ(v->symbol(), "posrf_hyp_qmc_sobol");
  EXPECT_FALSE(v->isPaperVariant());

  auto w = parseVariantName("posrf-qmc");
  ASSERT_TRUE(static_cast<bool>(w));
  EXPECT_EQ(w->component, "posrf");
  EXPECT_EQ(w->weights, "qmc");
}

TEST(VariantName, CaseAndSpacesAreForgiven) {
  auto v = parseVariantName("  SADERF-ORF ");
  ASSERT_TRUE(static_cast<bool>(v));
  EXPECT_EQ(v->name(), "saderf-orf");
}

TEST(VariantName, AllCombinationsRoundTrip) {
  std::vector<Variant> all = allVariants();
  EXPECT_EQ(all.size(), componentNames().size() * weightNames().size());
  for (const Variant &v : all) {
    auto parsed = parseVariantName(v.name());
    ASSERT_TRUE(static_cast<bool>(parsed)) << v.name() << ": " << errorOf(parsed.takeError());
    EXPECT_EQ(parsed->name(), v.name());
  }
}

TEST(VariantName, UnknownComponentListsValidNames) {
  auto v = parseVariantName("posfr-mm");
  ASSERT_FALSE(static_cast<bool>(v));
  std::string msg = errorOf(v.takeError());
  EXPECT_NE(msg.find("unknown component function in variant 'posfr-mm'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'posrf'?"), std::string::npos) << msg;
  EXPECT_NE(msg.find("valid components: posrf, oprf, saderf, trigrf, posrf-hyp, gerf, hcexp"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("valid weights: base, orf, sorf, qmc, qmc-sobol, mm, sgq, fastfood, fastfoodl, simrf, simrf-plus, scrf, ssr, gmm, generative"),
            std::string::npos)
      << msg;
}

TEST(VariantName, UnknownWeightsSuggestsTheNearestVariant) {
  auto v = parseVariantName("saderf-orff");
  ASSERT_FALSE(static_cast<bool>(v));
  std::string msg = errorOf(v.takeError());
  EXPECT_NE(msg.find("unknown weight matrix 'orff' in variant 'saderf-orff'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'saderf-orf'?"), std::string::npos) << msg;
}

TEST(VariantName, MalformedNames) {
  auto a = parseVariantName("posrf");
  ASSERT_FALSE(static_cast<bool>(a));
  EXPECT_NE(errorOf(a.takeError()).find("is not of the form <component>-<weights>"), std::string::npos);
  auto b = parseVariantName("");
  ASSERT_FALSE(static_cast<bool>(b));
  EXPECT_NE(errorOf(b.takeError()).find("empty variant name"), std::string::npos);
  auto c = parseVariantName("posrf-");
  ASSERT_FALSE(static_cast<bool>(c));
  EXPECT_NE(errorOf(c.takeError()).find("unknown weight matrix ''"), std::string::npos);
  auto d = parseVariantName("-mm");
  ASSERT_FALSE(static_cast<bool>(d));
}

TEST(VariantPlan, SgqRoundsToWholeCopiesOfTheRule) {
  VariantOptions opts; // m = 128, d = 32: the rule has 65 points
  auto plan = planVariant({"posrf", "sgq"}, opts);
  ASSERT_TRUE(static_cast<bool>(plan));
  EXPECT_EQ(plan->m, 65);
  ASSERT_EQ(plan->notes.size(), 1u);
  EXPECT_NE(plan->notes[0].find("sgq uses m = 65 (1 rotated copy of the 65-point rule"),
            std::string::npos)
      << plan->notes[0];
  opts.m = 260;
  auto four = planVariant({"oprf", "sgq"}, opts);
  ASSERT_TRUE(static_cast<bool>(four));
  EXPECT_EQ(four->m, 260);
  EXPECT_TRUE(four->notes.empty());
  opts.m = 10; // fewer than one copy: still one whole rule
  auto one = planVariant({"oprf", "sgq"}, opts);
  ASSERT_TRUE(static_cast<bool>(one));
  EXPECT_EQ(one->m, 65);
}

TEST(VariantPlan, RejectsOptionsWithReasons) {
  VariantOptions opts;
  opts.m = 32; // == d
  auto mm = planVariant({"posrf", "mm"}, opts);
  ASSERT_FALSE(static_cast<bool>(mm));
  EXPECT_EQ(errorOf(mm.takeError()),
            "variant 'posrf-mm': moment matching needs more points than dimensions (m > d), got "
            "m = 32, d = 32");

  VariantOptions bad;
  bad.d = 0;
  EXPECT_NE(errorOf(planVariant({"posrf", "orf"}, bad).takeError()).find("head dimension d must be in [1, 4096], got 0"),
            std::string::npos);
  bad = {};
  bad.dtype = "int8";
  EXPECT_NE(errorOf(planVariant({"posrf", "orf"}, bad).takeError()).find("dtype must be one of"),
            std::string::npos);
  bad = {};
  bad.componentOptions["a"] = 0.3;
  EXPECT_NE(errorOf(planVariant({"gerf", "orf"}, bad).takeError()).find("gerf needs a < 1/4, got a = 0.3"),
            std::string::npos);
  EXPECT_NE(errorOf(planVariant({"posrf", "orf"}, bad).takeError())
                .find("unknown option 'a': component 'posrf' takes none (gerf has a)"),
            std::string::npos);
  bad.componentOptions = {{"b", 0.1}};
  EXPECT_NE(errorOf(planVariant({"gerf", "orf"}, bad).takeError()).find("gerf has no option 'b'"),
            std::string::npos);
  // GMM's mixture count: a whole number in [1, m].
  bad.componentOptions = {{"components", 2.5}};
  EXPECT_NE(errorOf(planVariant({"posrf", "gmm"}, bad).takeError())
                .find("option components (the mixture count) must be an integer in [1, m = 128], got 2.5"),
            std::string::npos);
  bad.componentOptions = {{"components", 129}};
  EXPECT_NE(errorOf(planVariant({"posrf", "gmm"}, bad).takeError()).find("got 129"), std::string::npos);
  bad.componentOptions = {{"mixtures", 2}};
  EXPECT_NE(errorOf(planVariant({"posrf", "gmm"}, bad).takeError())
                .find("unknown option 'mixtures': component 'posrf' takes none (gerf has a), "
                      "weights gmm has components"),
            std::string::npos);
  VariantOptions good;
  good.componentOptions = {{"components", 4}};
  EXPECT_TRUE(static_cast<bool>(planVariant({"trigrf", "gmm"}, good)));
}

TEST(VariantModule, BuildsTheFeatureMapAndLinksOnlyWhatItUses) {
  mlir::MLIRContext context;
  VariantOptions opts;
  opts.m = 64;
  opts.d = 16;
  opts.seed = 7;
  auto module = buildVariantModule(&context, {"saderf", "orf"}, opts);
  ASSERT_TRUE(static_cast<bool>(module)) << errorOf(module.takeError());
  mlir::ModuleOp m = **module;
  EXPECT_EQ(m.getSymName(), "saderf_orf");

  auto maps = llvm::to_vector(m.getOps<mlir::spectra::FeatureMapOp>());
  ASSERT_EQ(maps.size(), 1u);
  EXPECT_EQ(maps[0].getSymName(), "saderf_orf");
  EXPECT_EQ(maps[0].getComponent(), "saderf");
  EXPECT_EQ(maps[0].getWeights(), "orf");
  EXPECT_EQ(maps[0].getM(), 64);
  EXPECT_EQ(maps[0].getD(), 16);
  EXPECT_EQ(maps[0].getSeed(), 7);

  auto recipes = llvm::to_vector(m.getOps<mlir::spectra::WeightRecipeOp>());
  ASSERT_EQ(recipes.size(), 1u);
  EXPECT_EQ(recipes[0].getSymName(), "orf");
  auto components = llvm::to_vector(m.getOps<mlir::spectra::ComponentOp>());
  ASSERT_EQ(components.size(), 1u);
  EXPECT_EQ(components[0].getSymName(), "saderf");
  EXPECT_TRUE(components[0].hasInputTransforms());
  EXPECT_EQ(components[0].getNumOutputs(), 1u);

  auto fn = m.lookupSymbol<mlir::func::FuncOp>("attention");
  ASSERT_TRUE(fn);
  auto q = llvm::cast<mlir::RankedTensorType>(fn.getArgumentTypes()[0]);
  EXPECT_EQ(q.getRank(), 4);
  EXPECT_EQ(q.getDimSize(3), 16);
  EXPECT_TRUE(q.getElementType().isF32());
}

TEST(VariantModule, EveryCombinationBuildsAndVerifies) {
  mlir::MLIRContext context;
  for (const Variant &v : allVariants()) {
    VariantOptions opts;
    opts.dtype = "bf16";
    Instantiation plan;
    auto module = buildVariantModule(&context, v, opts, &plan);
    ASSERT_TRUE(static_cast<bool>(module)) << v.name() << ": " << errorOf(module.takeError());
    auto map = *(**module).getOps<mlir::spectra::FeatureMapOp>().begin();
    EXPECT_EQ(map.getM(), plan.m) << v.name();
  }
}

TEST(VariantModule, OutputCountsOfTheComponents) {
  mlir::MLIRContext context;
  std::map<std::string, unsigned> expected = {{"posrf", 1}, {"oprf", 1},      {"saderf", 1},
                                              {"trigrf", 2}, {"posrf-hyp", 2}, {"gerf", 1},
                                              {"hcexp", 2}};
  for (const auto &[component, outputs] : expected) {
    auto module = buildVariantModule(&context, {component, "base"}, {});
    ASSERT_TRUE(static_cast<bool>(module)) << errorOf(module.takeError());
    auto c = *(**module).getOps<mlir::spectra::ComponentOp>().begin();
    EXPECT_EQ(c.getNumOutputs(), outputs) << component;
  }
}

TEST(VariantModule, GerfOptionReachesTheFeatureMap) {
  mlir::MLIRContext context;
  VariantOptions opts;
  opts.componentOptions["a"] = -0.5;
  auto module = buildVariantModule(&context, {"gerf", "orf"}, opts);
  ASSERT_TRUE(static_cast<bool>(module)) << errorOf(module.takeError());
  auto map = *(**module).getOps<mlir::spectra::FeatureMapOp>().begin();
  ASSERT_TRUE(map.getOptions().has_value());
  auto a = llvm::dyn_cast_or_null<mlir::FloatAttr>(map.getOptions()->get("a"));
  ASSERT_TRUE(a);
  EXPECT_DOUBLE_EQ(a.getValueAsDouble(), -0.5);
}

} // namespace

// The one NAME=VALUE parser and printer (frontend/OptionText.h) of the C API and the tools.
TEST(OptionText, ParsesPrintsAndNamesWhatIsWrong) {
  std::map<std::string, double> options;
  EXPECT_EQ(spectra::parseOption(" a = -0.2 ", options), "");
  EXPECT_EQ(spectra::parseOptionList("components=4,,hidden=32", options), "");
  EXPECT_EQ(options, (std::map<std::string, double>{{"a", -0.2}, {"components", 4}, {"hidden", 32}}));
  std::map<std::string, double> again;
  EXPECT_EQ(spectra::parseOptionList(spectra::formatOptionList(options), again), "");
  EXPECT_EQ(again, options) << "printing and parsing back is exact";
  EXPECT_EQ(spectra::formatOptionList({{"a", 0.1}}), "a=0.10000000000000001");
  EXPECT_EQ(spectra::parseOption("a", options), "expects NAME=VALUE with a number, got 'a'");
  EXPECT_EQ(spectra::parseOption("=3", options), "expects NAME=VALUE with a number, got '=3'");
  EXPECT_EQ(spectra::parseOption("a=two", options), "a takes a number, got 'two'");
  EXPECT_EQ(spectra::parseOptionList("a=1,b=x", options), "b takes a number, got 'x'");
}
