// ReadS3dis in both forms. First byte even: the rest is a room file. Odd:
// the rest is up to 6 object files of an Annotations/ folder, separated by
// NUL bytes, each "NAME\nLINES" (NAME of [A-Za-z0-9_.-], else the part is
// skipped).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/strings/str_split.h"
#include "fuzz/fuzz_util.h"
#include "worker/data/readers.h"

namespace {

bool GoodName(const std::string& name) {
  if (name.empty() || name.size() > 40 || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    const std::string path = fuzz::WriteScratchFile("room.txt", data + 1, size - 1);
    absl::StatusOr<worker::PointCloud> cloud = worker::ReadPointCloud(path, "s3dis", {});
    if (cloud.ok()) fuzz::Check(cloud->features.size() == cloud->size() * 3, "rgb per point");
    return 0;
  }
  const std::string room = fuzz::ScratchDir() + "/room";
  std::error_code ec;
  std::filesystem::remove_all(room, ec);
  std::filesystem::create_directories(room + "/Annotations");
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  int files = 0;
  for (absl::string_view part : absl::StrSplit(text, '\0')) {
    if (files == 6) break;
    const size_t newline = part.find('\n');
    if (newline == absl::string_view::npos) continue;
    const std::string name(part.substr(0, newline));
    if (!GoodName(name)) continue;
    const absl::string_view body = part.substr(newline + 1);
    fuzz::WriteFile(room + "/Annotations/" + name, reinterpret_cast<const uint8_t*>(body.data()),
                    body.size());
    ++files;
  }
  absl::StatusOr<worker::PointCloud> cloud = worker::ReadPointCloud(room, "s3dis", {});
  if (cloud.ok()) fuzz::Check(cloud->labels.size() == cloud->size(), "a label per point");
  return 0;
}
