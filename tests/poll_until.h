// Polling with a deadline, for tests that wait on another thread or process: the one loop
// behind their Await helpers.
#pragma once

#include <chrono>
#include <thread>

namespace chi_test {

/** Calls `pred` every `step_ms` until it returns true (true) or `sec` seconds pass (false). */
template <typename Pred>
bool PollUntil(Pred pred, double sec, int step_ms = 5) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(sec * 1000));
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  return true;
}

}  // namespace chi_test
