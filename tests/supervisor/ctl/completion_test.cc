// supervisor/ctl/completion.h: the bash completion generated from a CLI11
// definition, run by a real bash with the words of a command line.
#include "supervisor/ctl/completion.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

// What the completion function offers for `words` (the cursor on the
// last word), as bash fills COMPREPLY: sorted, space-separated.
std::string Complete(const std::string& script, const std::vector<std::string>& words) {
  testing::TempDir dir("completion");
  std::ofstream(dir.path() + "/completion.bash") << script;
  std::ofstream(dir.path() + "/driver.sh")
      << ". \"$(dirname \"$0\")/completion.bash\"\n"
         "COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); _prog\n"
         "printf '%s\\n' \"${COMPREPLY[@]}\" | sort | tr '\\n' ' '\n";
  std::string command = "bash --norc --noprofile '" + dir.path() + "/driver.sh'";
  for (const std::string& w : words) command += " '" + w + "'";
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

class Completion : public ::testing::Test {
 protected:
  Completion() {
    app_.fallthrough();
    app_.add_option("--socket", socket_, "socket");
    app_.add_option("-o,--output", output_, "format")->check(CLI::IsMember({"text", "json"}));
    CLI::App* submit = app_.add_subcommand("submit", "submit");
    submit->add_option("spec", spec_, "spec")->check(CLI::ExistingFile);
    submit->add_flag("--watch", watch_, "watch");
    CLI::App* describe = app_.add_subcommand("describe", "describe");
    describe->add_option("id", id_, "run id");
    app_.add_subcommand("drain", "drain");
    script_ = BashCompletion(app_, "prog");
  }

  CLI::App app_{"prog"};
  std::string socket_, output_, spec_, id_;
  bool watch_ = false;
  std::string script_;
};

TEST_F(Completion, VerbsFirst) {
  EXPECT_EQ(Complete(script_, {"prog", ""}), "describe drain submit");
  EXPECT_EQ(Complete(script_, {"prog", "d"}), "describe drain");
  EXPECT_EQ(Complete(script_, {"prog", "--socket", "/s", "su"}), "submit");
}

TEST_F(Completion, OptionsOfTheProgramAndOfTheVerb) {
  EXPECT_EQ(Complete(script_, {"prog", "--s"}), "--socket");
  EXPECT_EQ(Complete(script_, {"prog", "submit", "--w"}), "--watch");
  // fallthrough: the program's options after the verb too.
  EXPECT_EQ(Complete(script_, {"prog", "submit", "--so"}), "--socket");
  EXPECT_EQ(Complete(script_, {"prog", "describe", "--w"}), "");
}

TEST_F(Completion, ValuesFromTheirChecks) {
  EXPECT_EQ(Complete(script_, {"prog", "-o", ""}), "json text");
  EXPECT_EQ(Complete(script_, {"prog", "describe", "--output", "j"}), "json");
}

TEST_F(Completion, FilesWhereAFileIsExpected) {
  testing::TempDir dir("completion-files");
  std::ofstream(dir.path() + "/spec-a.toml") << "";
  const std::string prefix = dir.path() + "/spec-";
  EXPECT_EQ(Complete(script_, {"prog", "submit", prefix}), prefix + "a.toml");
  EXPECT_EQ(Complete(script_, {"prog", "--socket", prefix}), prefix + "a.toml");
  // A run id is not a file name.
  EXPECT_EQ(Complete(script_, {"prog", "describe", prefix}), "");
}

}  // namespace
}  // namespace trainsup::supervisor
