// The run spec and the daemon config read their TOML through one field
// reader (contracts/toml_reader.h): each kind of mistake is worded the same
// in both, after the field's dotted name.
#include "contracts/toml_reader.h"

#include <gtest/gtest.h>

#include <string>

#include "contracts/daemon_config.h"
#include "contracts/spec.h"

namespace trainsup {
namespace {

constexpr const char* kSpecHead = "name = \"r\"\n";

std::string SpecError(const std::string& toml) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec(toml);
  return spec.ok() ? "ok" : std::string(spec.status().message());
}

std::string ConfigError(const std::string& toml) {
  absl::StatusOr<supervisor::DaemonConfig> config = supervisor::ParseConfig(toml, "/tmp");
  return config.ok() ? "ok" : std::string(config.status().message());
}

TEST(TomlFields, TheSpecAndTheConfigWordEachMistakeAlike) {
  struct Case {
    const char* kind;
    std::string spec_text, spec_error, config_text, config_error;
  };
  const Case cases[] = {
      {"integer", "[train]\nbatch_size = \"x\"\n", "train.batch_size: must be an integer",
       "[slots]\ncpu_slots = \"x\"\n", "slots.cpu_slots: must be an integer"},
      {"range", "world_size = 65\n", "world_size: must be in [1, 64], got 65",
       "[slots]\ncpu_slots = 300\n", "slots.cpu_slots: must be in [0, 256], got 300"},
      {"open range", "[optimizer]\nmomentum = 1.0\n",
       "optimizer.momentum: must be in [0, 1), got 1", "[slots]\ngpu_release_timeout_s = 0\n",
       "slots.gpu_release_timeout_s: must be in (0, 3600], got 0"},
      {"number", "[optimizer]\nlr = \"fast\"\n", "optimizer.lr: must be a number",
       "[restart]\njitter = \"x\"\n", "restart.jitter: must be a number"},
      {"boolean", "[train]\ndeterministic = 1\n", "train.deterministic: must be true or false",
       "[slots]\nuse_gpus = 1\n", "slots.use_gpus: must be true or false"},
      {"string", "[model]\narch = 3\n", "model.arch: must be a string", "[daemon]\nstate_dir = 3\n",
       "daemon.state_dir: must be a string"},
      {"table", "model = 3\n", "model: must be a table", "daemon = 3\n", "daemon: must be a table"},
      {"unknown key", "colour = 1\n", "colour: unknown key", "[slots]\ncpu_slot = 1\n",
       "slots.cpu_slot: unknown key"},
      {"string array element", "[command]\nargv = [\"python3\", 3]\n",
       "command.argv[1]: must be a string", "[daemon]\ndata_roots = [\"/data\", 3]\n",
       "daemon.data_roots[1]: must be a string"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(SpecError(kSpecHead + c.spec_text), c.spec_error) << c.kind;
    EXPECT_EQ(ConfigError(c.config_text), c.config_error) << c.kind;
  }
}

TEST(TomlFields, SyntaxErrorsAreWordedAlike) {
  EXPECT_EQ(SpecError("name = \n").rfind("spec: not valid TOML at line 1, column 8: ", 0), 0u)
      << SpecError("name = \n");
  EXPECT_EQ(ConfigError("name = \n").rfind("not valid TOML at line 1, column 8: ", 0), 0u)
      << ConfigError("name = \n");
}

TEST(TomlFields, TheReaderRejectsWhatItWasNotAskedFor) {
  absl::StatusOr<toml::table> root = ParseTomlText("a = 1\nb = 2\n[t]\nc = \"x\"\n");
  ASSERT_TRUE(root.ok()) << root.status();
  TomlFieldReader r(&*root, "");
  int64_t a = 0;
  ASSERT_TRUE(r.Int("a", &a, 0, 10).ok());
  EXPECT_EQ(a, 1);
  absl::StatusOr<const toml::table*> t = r.Table("t");
  ASSERT_TRUE(t.ok());
  TomlFieldReader inner(*t, "t");
  std::string c;
  EXPECT_EQ(inner.String("c", &c, {"y", "z"}).message(), "t.c: must be one of y, z; got \"x\"");
  EXPECT_EQ(r.Finish().message(), "b: unknown key");
  int64_t b = 0;
  EXPECT_EQ(r.Int("b", &b, 0, 1).message(), "b: must be in [0, 1], got 2");
  EXPECT_TRUE(r.Finish().ok());
}

}  // namespace
}  // namespace trainsup
