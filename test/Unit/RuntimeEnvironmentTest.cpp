//===- RuntimeEnvironmentTest.cpp - the LibTorch side links and runs -----===//

#include "runtime/Environment.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

namespace {

TEST(RuntimeEnvironment, ReportsTheLinkedTorch) {
  spectra::runtime::Environment env = spectra::runtime::describeEnvironment();
  EXPECT_EQ(env.torchVersion, std::string(TORCH_VERSION));
  EXPECT_GE(env.cpuThreads, 1);
  // The count torch itself reports (0 on a machine without a GPU).
  EXPECT_EQ(env.cudaDevices, static_cast<int>(torch::cuda::device_count()));
  std::string line = spectra::runtime::formatEnvironment(env);
  EXPECT_EQ(line.rfind("LibTorch " + env.torchVersion + ", ", 0), 0u) << line;
}

TEST(RuntimeEnvironment, TorchNumericsAndAutogradWork) {
  // The runtime leans on LibTorch numerics and autograd: check both in float64.
  torch::Tensor x = torch::tensor({0.5, -1.0, 2.0}, torch::dtype(torch::kFloat64).requires_grad(true));
  torch::Tensor y = (x.exp() * x).sum();
  y.backward();
  torch::Tensor expected = (x.detach().exp() * (x.detach() + 1));
  EXPECT_TRUE(torch::allclose(x.grad(), expected, 0, 1e-15));
}

} // namespace
