#include "supervisor/policy/straggler.h"

#include <algorithm>
#include <cmath>

namespace trainsup::supervisor {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

}  // namespace

StragglerDetector::StragglerDetector(double factor, double window_s)
    : factor_(factor), window_s_(window_s) {}

void StragglerDetector::Trim(Rank& r, double now_s) const {
  while (!r.samples.empty() && r.samples.front().first < now_s - window_s_) r.samples.pop_front();
}

void StragglerDetector::Observe(int rank, double now_s, double compute_s) {
  if (!std::isfinite(compute_s) || compute_s < 0) return;
  Rank& r = ranks_[rank];
  if (r.first_s < 0) r.first_s = now_s;
  r.samples.emplace_back(now_s, compute_s);
  Trim(r, now_s);
}

void StragglerDetector::Forget(int rank) { ranks_.erase(rank); }

std::vector<StragglerDetector::Change> StragglerDetector::Judge(double now_s) {
  std::map<int, double> medians;
  for (auto& [rank, r] : ranks_) {
    Trim(r, now_s);
    r.median = 0;
    if (r.samples.empty()) continue;
    std::vector<double> values;
    for (const auto& [t, s] : r.samples) values.push_back(s);
    r.median = Median(std::move(values));
    medians[rank] = r.median;
  }
  std::vector<Change> changes;
  for (auto& [rank, r] : ranks_) {
    const auto mine = medians.find(rank);
    if (mine == medians.end() || now_s - r.first_s < window_s_) continue;
    std::vector<double> others;
    for (const auto& [other, m] : medians) {
      if (other != rank) others.push_back(m);
    }
    if (others.empty()) continue;
    const double others_s = Median(std::move(others));
    const bool now_straggler = others_s > 0 && mine->second > factor_ * others_s;
    r.ratio = now_straggler ? mine->second / others_s : 0;
    if (now_straggler != r.straggler) {
      r.straggler = now_straggler;
      changes.push_back({rank, now_straggler, mine->second, others_s});
    }
  }
  return changes;
}

bool StragglerDetector::straggler(int rank) const {
  const auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.straggler;
}

double StragglerDetector::median_s(int rank) const {
  const auto it = ranks_.find(rank);
  return it == ranks_.end() ? 0 : it->second.median;
}

double StragglerDetector::ratio(int rank) const {
  const auto it = ranks_.find(rank);
  return it == ranks_.end() ? 0 : it->second.ratio;
}

}  // namespace trainsup::supervisor
