#include "worker/train/guard.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainsup::worker {

double StepGuard::Median() const {
  if (losses_.empty()) return 0;
  std::vector<double> v(losses_.begin(), losses_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double median = v[mid];
  if (v.size() % 2 == 0) {
    median =
        (median + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
  }
  return median;
}

namespace {

// %g, with every NaN "nan" (printf writes a negative one "-nan").
std::string Number(double v) { return std::isnan(v) ? "nan" : absl::StrFormat("%g", v); }

}  // namespace

GuardDecision StepGuard::Judge(int64_t step, double loss, double grad_norm, bool stats_finite) {
  GuardDecision d;
  if (spec_.check_finite && !std::isfinite(loss)) {
    d.verdict = StepVerdict::kNonFinite;
    d.seen = absl::StrCat("loss ", Number(loss));
  } else if (spec_.check_finite && !std::isfinite(grad_norm)) {
    d.verdict = StepVerdict::kNonFinite;
    d.seen = absl::StrCat("gradient norm ", Number(grad_norm), " (loss ", Number(loss), ")");
  } else if (spec_.check_finite && !stats_finite) {
    d.verdict = StepVerdict::kNonFinite;
    d.seen = absl::StrCat("BatchNorm running statistics not finite (loss ", Number(loss), ")");
  } else if (spec_.spike_factor > 0 && applied_ >= spec_.spike_warmup && std::isfinite(loss)) {
    const double median = Median();
    if (median > 0 && loss > spec_.spike_factor * median) {
      d.verdict = StepVerdict::kSpike;
      d.seen = absl::StrFormat("loss %g is %.1f times the median %g of the last %d steps", loss,
                               loss / median, median, static_cast<int>(losses_.size()));
    }
  }
  if (d.verdict == StepVerdict::kApply) {
    // With check_finite off a non-finite loss is applied, but never enters
    // the window (its median, and the checkpoint's JSON, need numbers).
    if (std::isfinite(loss)) losses_.push_back(loss);
    while (static_cast<int64_t>(losses_.size()) > spec_.spike_window) losses_.pop_front();
    ++applied_;
  } else {
    bad_.emplace_back(step, d.seen);
  }
  while (!bad_.empty() && bad_.front().first <= step - spec_.bad_window) bad_.pop_front();
  if (d.verdict != StepVerdict::kApply &&
      static_cast<int64_t>(bad_.size()) >= spec_.max_bad_steps) {
    d.diverged = true;
    d.first_bad_step = bad_.front().first;
    std::vector<std::string> seen;
    for (const auto& [s, what] : bad_) seen.push_back(absl::StrCat("step ", s, ": ", what));
    d.diverged_message = absl::StrCat("diverged at step ", d.first_bad_step, ": ", bad_.size(),
                                      " bad step", bad_.size() == 1 ? "" : "s", " within ",
                                      spec_.bad_window, " (", absl::StrJoin(seen, "; "), ")");
  }
  return d;
}

nlohmann::json StepGuard::ToJson() const {
  nlohmann::json bad = nlohmann::json::array();
  for (const auto& [s, what] : bad_) bad.push_back({{"step", s}, {"seen", what}});
  return {{"losses", std::vector<double>(losses_.begin(), losses_.end())},
          {"applied", applied_},
          {"bad", bad}};
}

absl::Status StepGuard::FromJson(const nlohmann::json& j) {
  try {
    std::deque<double> losses;
    for (const auto& l : j.at("losses")) losses.push_back(l.get<double>());
    std::deque<std::pair<int64_t, std::string>> bad;
    for (const auto& b : j.at("bad")) {
      bad.emplace_back(b.at("step").get<int64_t>(), b.at("seen").get<std::string>());
    }
    const int64_t applied = j.at("applied").get<int64_t>();
    losses_ = std::move(losses);
    while (static_cast<int64_t>(losses_.size()) > spec_.spike_window) losses_.pop_front();
    bad_ = std::move(bad);
    applied_ = applied;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("the guard's state: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace trainsup::worker
