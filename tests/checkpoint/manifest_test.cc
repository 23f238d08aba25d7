// MANIFEST.json parsing: every number is range-checked in its full width,
// never narrowed into its field.
#include "checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace trainsup::ckpt {
namespace {

// A manifest with these fields spliced in as raw JSON text.
std::string ManifestJson(const std::string& format_version, const std::string& step,
                         const std::string& size = "3",
                         const std::string& hash = "\"" + std::string(32, 'f') + "\"") {
  return absl::StrCat(R"({"format": "trainsup-checkpoint", "format_version": )", format_version,
                      R"(, "step": )", step, R"(, "created": "2026-11-29T00:00:00Z", "files": [)",
                      R"({"name": "a.bin", "size": )", size, R"(, "xxh3_128": )", hash, "}]}");
}

void ExpectRejected(const std::string& json, const std::string& field) {
  absl::StatusOr<Manifest> m = Manifest::FromJson(json);
  ASSERT_FALSE(m.ok()) << json << " read as format_version " << m->format_version << " step "
                       << m->step;
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << json;
  EXPECT_NE(m.status().message().find(field), absl::string_view::npos)
      << json << ": " << m.status();
}

TEST(Manifest, FormatVersionIsRangeCheckedNotNarrowed) {
  // 2^32 + 1 narrowed to int is 1, the version this build reads.
  ExpectRejected(ManifestJson("4294967297", "9"), "format_version");
  ExpectRejected(ManifestJson("18446744073709551615", "9"), "format_version");
  ExpectRejected(ManifestJson("0", "9"), "format_version");
  ExpectRejected(ManifestJson("-1", "9"), "format_version");
  ExpectRejected(ManifestJson("1.0", "9"), "format_version");
  // A later version still parses, so the store can say which it is.
  absl::StatusOr<Manifest> later = Manifest::FromJson(ManifestJson("2", "9"));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->format_version, 2);
}

TEST(Manifest, StepIsRangeCheckedNotNarrowed) {
  // 2^64 - 1 narrowed to int64 is -1.
  ExpectRejected(ManifestJson("1", "18446744073709551615"), "step");
  ExpectRejected(ManifestJson("1", "9223372036854775808"), "step");
  ExpectRejected(ManifestJson("1", "-1"), "step");
  ExpectRejected(ManifestJson("1", "2.5"), "step");
  absl::StatusOr<Manifest> max = Manifest::FromJson(ManifestJson("1", "9223372036854775807"));
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->step, INT64_MAX);
  absl::StatusOr<Manifest> zero = Manifest::FromJson(ManifestJson("1", "0"));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->step, 0);
}

TEST(Manifest, FileEntriesAreCheckedFieldByField) {
  ExpectRejected(ManifestJson("1", "9", "-3"), "size");
  ExpectRejected(ManifestJson("1", "9", "3.0"), "size");
  ExpectRejected(ManifestJson("1", "9", "3", "\"abc\""), "xxh3_128");
  ExpectRejected(ManifestJson("1", "9", "3", "\"" + std::string(32, 'F') + "\""), "xxh3_128");
  ExpectRejected(ManifestJson("1", "9", "3", "7"), "xxh3_128");
  absl::StatusOr<Manifest> big = Manifest::FromJson(ManifestJson("1", "9", "18446744073709551615"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->files[0].size, UINT64_MAX);
}

TEST(Manifest, RoundTripsAtTheEdgesOfItsRanges) {
  Manifest m;
  m.step = INT64_MAX;
  m.created = "2026-11-29T00:00:00Z";
  m.files.push_back({"a.bin", UINT64_MAX, "0123456789abcdef0123456789abcdef"});
  absl::StatusOr<Manifest> back = Manifest::FromJson(m.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), m.ToJson());
}

}  // namespace
}  // namespace trainsup::ckpt
