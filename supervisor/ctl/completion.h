// Shell completion for a CLI11 program, generated from the program's own
// option and subcommand definitions, so it cannot drift from them.
// `trainctl completion bash` prints it; the Debian package installs it as
// /usr/share/bash-completion/completions/trainctl.
#ifndef TRAINSUP_SUPERVISOR_CTL_COMPLETION_H_
#define TRAINSUP_SUPERVISOR_CTL_COMPLETION_H_

#include <string>

namespace CLI {
class App;
}

namespace trainsup::supervisor {

// A bash script that defines _<program> and registers it with `complete`
// for `program`. It completes: the subcommands and the global options
// before a subcommand; a subcommand's options after it; the values of an
// option (or positional) whose check is a set of words (CLI::IsMember) from
// that set, and of any other option or positional that takes a value as
// file names. Needs nothing but bash (not the bash-completion package).
std::string BashCompletion(const CLI::App& app, const std::string& program);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CTL_COMPLETION_H_
