// Injectable clock so timing and fault tests need no real waiting.
#pragma once

#include <atomic>
#include <cstdint>

namespace tandem {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary fixed origin (monotonic).
  virtual double NowSeconds() const = 0;
  virtual void SleepFor(double seconds) = 0;
};

// steady_clock and std::this_thread::sleep_for.
class RealClock : public Clock {
 public:
  double NowSeconds() const override;
  void SleepFor(double seconds) override;
  static RealClock* Get();
};

// A clock that moves only when told; SleepFor advances it. Safe from several threads.
class FakeClock : public Clock {
 public:
  double NowSeconds() const override { return now_.load(); }
  void SleepFor(double seconds) override { Advance(seconds); }
  void Advance(double seconds);

 private:
  std::atomic<double> now_{0};
};

}  // namespace tandem
