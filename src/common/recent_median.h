// The median of the last few samples of a timing: the online estimate of a pass's cost. A
// moving average moves with every stall (one pass slowed several-fold when another process
// takes a core shifts it, and with it the whole cost curve); a median of 15 needs 8 stalls in a
// row.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace specrpc {

class RecentMedian {
  public:
    static constexpr int kWindow = 15;

    // Adds a sample and updates the median here, once per sample: the engine reads every size's
    // median each time t(1) gets a sample (every plain round), so computing it on read was
    // repeated work on the hot path.
    void add(double x) {
        buf_[static_cast<size_t>(count_ % kWindow)] = x;
        ++count_;
        const int n = static_cast<int>(std::min<int64_t>(count_, kWindow));
        std::array<double, kWindow> s = buf_;
        std::nth_element(s.begin(), s.begin() + n / 2, s.begin() + n);
        median_ = s[static_cast<size_t>(n / 2)];
    }
    // Samples seen in all (not only those still in the window).
    int64_t count() const { return count_; }
    // Median of the samples in the window; 0 when there are none.
    double median() const { return median_; }

  private:
    std::array<double, kWindow> buf_{};
    int64_t                     count_  = 0;
    double                      median_ = 0.0;
};

}  // namespace specrpc
