// Included before every translation unit of the fuzz build that uses
// toml++ (CMakeLists.txt): its debug assertions off, as in Debian's build of
// the library (NDEBUG, GCC, where TOML_ASSERT_ASSUME expands to nothing), so
// the fuzzers test the parser production runs. One of them fires on "[+",
// which toml++ then rejects with a parse error.
#ifndef TRAINSUP_FUZZ_TOML_CONFIG_H_
#define TRAINSUP_FUZZ_TOML_CONFIG_H_

#define TOML_ASSERT(expr) static_assert(true)

#endif  // TRAINSUP_FUZZ_TOML_CONFIG_H_
