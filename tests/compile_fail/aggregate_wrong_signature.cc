// Must not compile: a task whose Aggregate takes its replica by value (or returns something,
// or takes no index) would be skipped for the default fold, so a Broadcast over four
// containers would report one replica's outputs (tests/packaging.cmake). AGGREGATE_CASE picks
// the wrong signature.
#include <chi/chi.h>

struct CountTask : public chi::Task {
  CHI_OUT chi::u32 count_ = 0;
#if AGGREGATE_CASE == 1
  void Aggregate(CountTask replica, chi::u32) { count_ += replica.count_; }  // by value
#elif AGGREGATE_CASE == 2
  void Aggregate(const CountTask &replica) { count_ += replica.count_; }  // no index
#else
  bool Aggregate(const CountTask &replica, chi::u32) { return count_ += replica.count_; }
#endif
  template <typename Ar>
  void SerializeIn(Ar &) {}
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(count_);
  }
};

// Making a task instantiates its operations, the fold among them.
chi::Task *Make() { return chi::NewTask<CountTask>(); }
