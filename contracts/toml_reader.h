// The one TOML field reader of the run spec (spec.cc) and the daemon's
// config (daemon_config.cc): each key of a table read into a field with its
// type and bounds checked, and each kind of mistake worded once, after the
// key's dotted name:
//   train.batch_size: must be an integer
//   train.batch_size: must be in [1, 4096], got 0
//   optimizer.momentum: must be in [0, 1), got 1
//   optimizer.lr: must be a number
//   train.deterministic: must be true or false
//   model.arch: must be a string | must be one of a, b; got "c"
//   command.argv: must be an array of strings   command.argv[1]: must be a string
//   model: must be a table
//   model.arhc: unknown key
// Every key read is remembered; Finish() rejects the first one that was
// not, so an unknown or misspelt key is an error rather than ignored.
// Absent keys leave their field as it is (the default).
#ifndef TRAINSUP_CONTRACTS_TOML_READER_H_
#define TRAINSUP_CONTRACTS_TOML_READER_H_

#include <toml++/toml.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainsup {

// `text` behind the character guard (toml_guard.h), parsed. InvalidArgument
// "not valid TOML at line L, column C: <toml++'s description>", or the
// guard's message.
absl::StatusOr<toml::table> ParseTomlText(absl::string_view text);

class TomlFieldReader {
 public:
  // `table` may be null (an absent table: every key is absent); `prefix` is
  // the table's dotted name ("" for the root).
  TomlFieldReader(const toml::table* table, std::string prefix);

  absl::Status Int(const std::string& key, int64_t* out, int64_t lo, int64_t hi);
  // An integer or a float; bounds inclusive unless `lo_open` / `hi_open`.
  // NaN and infinities are out of every range.
  absl::Status Double(const std::string& key, double* out, double lo, double hi,
                      bool lo_open = false, bool hi_open = false);
  absl::Status Bool(const std::string& key, bool* out);
  // Up to 4096 bytes; one of `allowed` unless it is empty.
  absl::Status String(const std::string& key, std::string* out,
                      std::initializer_list<const char*> allowed = {});
  // Any number of strings (each up to 4096 bytes, without NUL).
  absl::Status StringList(const std::string& key, std::vector<std::string>* out);
  // 1..`max_entries` non-empty strings (each up to 4096 bytes, without NUL).
  absl::Status StringArray(const std::string& key, std::vector<std::string>* out,
                           size_t max_entries);
  // A table of strings (each up to 4096 bytes, without NUL) whose keys pass
  // `check_name` (an error message, "" when the name is fine).
  absl::Status StringTable(const std::string& key, std::map<std::string, std::string>* out,
                           const std::function<std::string(const std::string&)>& check_name);
  // A sub-table; nullptr when absent.
  absl::StatusOr<const toml::table*> Table(const std::string& key);
  // The raw node (nullptr when absent), for shapes the calls above do not
  // cover ([[auth.tokens]]); the key counts as read.
  const toml::node* Get(const std::string& key);

  // The first key of the table that was not read: "<path>: unknown key".
  absl::Status Finish() const;

  // "prefix.key", or "key" at the root.
  std::string Path(const std::string& key) const;
  // InvalidArgument "<path>: <what>".
  absl::Status Error(const std::string& key, const std::string& what) const;

 private:
  // Strings handed to exec and the environment: C strings, bounded.
  absl::Status CheckText(const std::string& key, const std::string& value) const;
  absl::Status Strings(const std::string& key, const toml::array& array, bool non_empty,
                       std::vector<std::string>* out) const;

  const toml::table* table_;
  std::string prefix_;
  std::set<std::string> seen_;
};

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_TOML_READER_H_
