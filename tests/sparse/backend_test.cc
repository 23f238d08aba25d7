// The backend table's selection (sparse/backend.h): names, the defaults by
// device, the override and its guard, and errors for what is not built.
#include "sparse/backend.h"

#include <gtest/gtest.h>

#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::ErrorMessage;

TEST(Backend, NamesRoundTrip) {
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kGeneric, BackendKind::kCuda}) {
    EXPECT_EQ(BackendKindFromString(ToString(kind)), kind);
  }
  EXPECT_NE(ErrorMessage([] {
              BackendKindFromString("opencl");
            }).find("unknown backend 'opencl' (expected cpu, generic or cuda)"),
            std::string::npos);
}

TEST(Backend, CpuIsBuiltFirstAndRunsCpuTensors) {
  ASSERT_FALSE(BuiltBackends().empty());
  EXPECT_EQ(BuiltBackends()[0], BackendKind::kCpu);
  BackendGuard none(std::nullopt);
  const Backend& b = BackendFor(c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(b.kind, BackendKind::kCpu);
  EXPECT_STREQ(b.name, "cpu");
  EXPECT_TRUE(b.runs_on(c10::DeviceType::CPU));
  EXPECT_FALSE(b.runs_on(c10::DeviceType::CUDA));
}

TEST(Backend, GuardRestoresThePreviousOverride) {
  const std::optional<BackendKind> before = BackendOverride();
  {
    BackendGuard cpu(BackendKind::kCpu);
    EXPECT_EQ(BackendOverride(), BackendKind::kCpu);
    {
      BackendGuard none(std::nullopt);
      EXPECT_FALSE(BackendOverride().has_value());
    }
    EXPECT_EQ(BackendOverride(), BackendKind::kCpu);
  }
  EXPECT_EQ(BackendOverride(), before);
}

TEST(Backend, AskingForABackendNotBuiltFailsAndKeepsTheOverride) {
  const std::optional<BackendKind> before = BackendOverride();
  for (BackendKind kind : {BackendKind::kGeneric, BackendKind::kCuda}) {
    if (FindBackend(kind) != nullptr) continue;
    EXPECT_NE(ErrorMessage([&] {
                SetBackendOverride(kind);
              }).find("backend '" + ToString(kind) + "' is not in this build (built: cpu"),
              std::string::npos);
    EXPECT_EQ(BackendOverride(), before);
  }
}

}  // namespace
}  // namespace trainsup::sparse
