#include "common/clock.h"

#include <chrono>
#include <thread>

namespace tandem {

double RealClock::NowSeconds() const {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void RealClock::SleepFor(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock;
  return clock;
}

void FakeClock::Advance(double seconds) {
  double cur = now_.load();
  while (!now_.compare_exchange_weak(cur, cur + seconds)) {
  }
}

}  // namespace tandem
