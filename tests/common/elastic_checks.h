// What the elastic tests read back from a run (docs/distributed.md,
// "Elastic"): rank 0's data.log_samples lines, the samples of each epoch,
// and how far two checkpoints' weights are apart. Header-only, for the
// worker's process tests and the daemon's integration tests alike.
#ifndef TRAINSUP_TESTS_COMMON_ELASTIC_CHECKS_H_
#define TRAINSUP_TESTS_COMMON_ELASTIC_CHECKS_H_

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"

namespace trainsup::testing {

// step -> "(epoch E): I:SEED ..." from the "samples of step N (epoch E):
// ..." lines of `log`, added to `lines` (a later log's line for a step
// replaces an earlier one's: the steps after an attempt's last checkpoint
// are trained again by the next).
inline void AddSampleLines(const std::string& log, std::map<int, std::string>* lines) {
  static const std::regex kLine("samples of step ([0-9]+) (\\(epoch [0-9]+\\): [^\\n]*)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kLine); it != std::sregex_iterator();
       ++it) {
    (*lines)[std::stoi((*it)[1])] = (*it)[2];
  }
}

inline std::map<int, std::string> SampleLines(const std::string& log) {
  std::map<int, std::string> lines;
  AddSampleLines(log, &lines);
  return lines;
}

// epoch -> the sample indices its steps trained, sorted.
inline std::map<int, std::vector<int>> SamplesPerEpoch(const std::map<int, std::string>& lines) {
  std::map<int, std::vector<int>> per_epoch;
  static const std::regex kEntry("([0-9]+):[0-9a-f]{16}");
  static const std::regex kEpoch("\\(epoch ([0-9]+)\\)");
  for (const auto& [step, line] : lines) {
    std::smatch e;
    if (!std::regex_search(line, e, kEpoch)) {
      ADD_FAILURE() << "step " << step << ": no epoch in " << line;
      continue;
    }
    std::vector<int>& samples = per_epoch[std::stoi(e[1])];
    for (auto it = std::sregex_iterator(line.begin(), line.end(), kEntry);
         it != std::sregex_iterator(); ++it) {
      samples.push_back(std::stoi((*it)[1]));
    }
  }
  for (auto& [epoch, samples] : per_epoch) std::sort(samples.begin(), samples.end());
  return per_epoch;
}

// The tensors of a checkpoint's model.safetensors (empty, and a failure,
// when it cannot be read).
inline std::map<std::string, at::Tensor> ReadWeights(const std::string& path) {
  absl::StatusOr<ckpt::SafetensorsFile> f =
      ckpt::ReadSafetensors(ckpt::FileSystem::Default(), path);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? f->tensors : std::map<std::string, at::Tensor>();
}

// The largest |a - b| / (1 + |b|) over every floating tensor; with
// `same_counts`, the integer tensors (BatchNorm's num_batches_tracked) must
// be equal.
inline double WeightsGap(const std::map<std::string, at::Tensor>& a,
                         const std::map<std::string, at::Tensor>& b, bool same_counts = true) {
  EXPECT_EQ(a.size(), b.size());
  double gap = 0;
  for (const auto& [name, t] : b) {
    auto it = a.find(name);
    if (it == a.end()) {
      ADD_FAILURE() << name << " missing";
      continue;
    }
    if (!t.is_floating_point()) {
      if (same_counts) EXPECT_TRUE(at::equal(it->second, t)) << name;
      continue;
    }
    const at::Tensor d =
        (it->second.to(at::kDouble) - t.to(at::kDouble)).abs() / (t.to(at::kDouble).abs() + 1.0);
    gap = std::max(gap, d.max().item<double>());
  }
  return gap;
}

}  // namespace trainsup::testing

#endif  // TRAINSUP_TESTS_COMMON_ELASTIC_CHECKS_H_
