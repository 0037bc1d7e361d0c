//! Per-node clocks.
//!
//! madsim has one global simulated time; real machines do not agree on the time. Every node reads time
//! through its own [`Clock`]: simulated time plus an offset (changed by `clock-jump`) running at a rate
//! (changed by `clock-drift`). Backends expire keys, leases and sessions by their own clock and clients
//! compute lock validity by theirs, so a jump on one node is seen by that node alone.
//!
//! Wall time is what `gettimeofday` returns: jumps move it. Timers (`sleep`, timeouts) follow the
//! monotonic clock: a jump does not move them, but drift does — a fast oscillator makes a node's
//! "one second" pass sooner.

use madsim::time::TimeHandle;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::Duration;

thread_local! {
    /// The running world's time source, kept by [`TimeCache`]: `TimeHandle::current()` clones two `Arc`s
    /// (and drops them) on every reading, and time is read on every message and event.
    static TIME: RefCell<Option<TimeHandle>> = const { RefCell::new(None) };
}

/// Nanoseconds of simulated time since the world started.
pub fn sim_now_ns() -> u64 {
    let elapsed = TIME.with(|t| t.borrow().as_ref().map(TimeHandle::elapsed));
    elapsed.unwrap_or_else(|| TimeHandle::current().elapsed()).as_nanos() as u64
}

/// madsim's `sleep(d)`, from the cached time source when there is one (the same timer, without
/// looking up the runtime).
pub(crate) fn sleep(d: Duration) -> madsim::time::Sleep {
    let sleep = TIME.with(|t| t.borrow().as_ref().map(|h| h.sleep(d)));
    sleep.unwrap_or_else(|| madsim::time::sleep(d))
}

/// madsim's `timeout(d, future)`, likewise.
pub(crate) fn timeout<F: std::future::Future>(
    d: Duration,
    future: F,
) -> impl std::future::Future<Output = Result<F::Output, madsim::time::error::Elapsed>> {
    let handle = TIME.with(|t| t.borrow().clone()).unwrap_or_else(TimeHandle::current);
    handle.timeout(d, future)
}

/// Keeps the current runtime's time source for [`sim_now_ns`] on this thread while it lives (a world
/// holds one; it is made and dropped inside the runtime's `block_on`). Without one, every reading asks
/// madsim for the current runtime.
pub(crate) struct TimeCache {
    previous: Option<TimeHandle>,
}

impl TimeCache {
    /// Call inside a madsim runtime.
    pub(crate) fn install() -> TimeCache {
        TimeCache { previous: TIME.with(|t| t.borrow_mut().replace(TimeHandle::current())) }
    }
}

impl Drop for TimeCache {
    fn drop(&mut self) {
        let previous = self.previous.take();
        // The thread may be ending (its locals already gone): then there is nothing left to restore.
        let _ = TIME.try_with(|t| *t.borrow_mut() = previous);
    }
}

/// One node's view of time. Cheap to clone; clones share the same clock.
#[derive(Clone, Debug)]
pub struct Clock(Arc<Mutex<ClockState>>);

#[derive(Debug)]
struct ClockState {
    /// Wall nanoseconds at `anchor_ns` of simulated time.
    wall_at_anchor_ns: i64,
    /// Monotonic nanoseconds at `anchor_ns`: like wall time, but jumps do not move it.
    mono_at_anchor_ns: i64,
    anchor_ns: u64,
    /// Wall nanoseconds per simulated nanosecond.
    rate: f64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock(Arc::new(Mutex::new(ClockState { wall_at_anchor_ns: 0, mono_at_anchor_ns: 0, anchor_ns: 0, rate: 1.0 })))
    }
}

impl ClockState {
    fn elapsed_ns(&self, sim_ns: u64) -> i64 {
        (sim_ns.saturating_sub(self.anchor_ns) as f64 * self.rate) as i64
    }

    fn wall_ns(&self, sim_ns: u64) -> i64 {
        self.wall_at_anchor_ns + self.elapsed_ns(sim_ns)
    }

    fn reanchor(&mut self, sim_ns: u64) {
        self.mono_at_anchor_ns += self.elapsed_ns(sim_ns);
        self.wall_at_anchor_ns = self.wall_ns(sim_ns);
        self.anchor_ns = sim_ns;
    }
}

impl Clock {
    /// Wall time in milliseconds (may go backwards after a negative jump).
    pub fn now_ms(&self) -> i64 {
        self.wall_ns_at(sim_now_ns()).div_euclid(1_000_000)
    }

    /// The monotonic clock in milliseconds (Go's monotonic reading, `Instant`): drift changes its pace,
    /// jumps do not move it. Deadlines that must survive a clock step are measured with it.
    pub fn monotonic_ms(&self) -> i64 {
        let s = self.0.lock().expect("clock lock");
        (s.mono_at_anchor_ns + s.elapsed_ns(sim_now_ns())).div_euclid(1_000_000)
    }

    /// Wall and monotonic time in milliseconds, read together (one lock).
    pub fn readings_ms(&self) -> (i64, i64) {
        let s = self.0.lock().expect("clock lock");
        let sim_ns = sim_now_ns();
        let mono_ns = s.mono_at_anchor_ns + s.elapsed_ns(sim_ns);
        (s.wall_ns(sim_ns).div_euclid(1_000_000), mono_ns.div_euclid(1_000_000))
    }

    /// Wall time in nanoseconds at a given simulated instant.
    pub fn wall_ns_at(&self, sim_ns: u64) -> i64 {
        self.0.lock().expect("clock lock").wall_ns(sim_ns)
    }

    /// How long simulated time must pass for this node's timers to measure `d`.
    pub fn real_duration(&self, d: Duration) -> Duration {
        let rate = self.0.lock().expect("clock lock").rate;
        Duration::from_nanos((d.as_nanos() as f64 / rate) as u64)
    }

    /// Step the wall clock by `delta_ms` (NTP step, operator error, VM migration).
    pub fn jump(&self, delta_ms: i64) {
        let mut s = self.0.lock().expect("clock lock");
        s.reanchor(sim_now_ns());
        s.wall_at_anchor_ns += delta_ms * 1_000_000;
    }

    /// Run at `rate` wall seconds per simulated second from now on (1.0 is a perfect clock).
    pub fn set_rate(&self, rate: f64) {
        assert!(rate > 0.0, "a clock rate must be positive");
        let mut s = self.0.lock().expect("clock lock");
        s.reanchor(sim_now_ns());
        s.rate = rate;
    }

    /// Sleep for `d` as this node's timers measure it.
    pub async fn sleep(&self, d: Duration) {
        sleep(self.real_duration(d)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_world<F: std::future::Future<Output = ()> + 'static>(f: F) {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(f)
    }

    #[test]
    fn a_jump_moves_wall_time_but_not_timers() {
        in_world(async {
            let c = Clock::default();
            madsim::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(c.now_ms(), 1000);
            c.jump(5000);
            assert_eq!(c.now_ms(), 6000);
            c.sleep(Duration::from_secs(1)).await;
            assert_eq!(c.now_ms(), 7000);
            assert_eq!(c.monotonic_ms(), 2000, "the monotonic clock ignores the jump");
            assert_eq!(sim_now_ns() / 1_000_000, 2_000, "madsim adds only nanoseconds of jitter");
        });
    }

    #[test]
    fn drift_speeds_up_wall_time_and_timers() {
        in_world(async {
            let c = Clock::default();
            c.set_rate(2.0);
            c.sleep(Duration::from_secs(2)).await;
            assert_eq!(sim_now_ns() / 1_000_000, 1_000, "a 2x clock measures 2 s in 1 s");
            assert_eq!(c.now_ms(), 2000);
            c.set_rate(1.0);
            madsim::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(c.now_ms(), 3000);
        });
    }

    #[test]
    fn a_negative_jump_goes_backwards() {
        in_world(async {
            let c = Clock::default();
            c.jump(-1500);
            assert_eq!(c.now_ms(), -1500);
        });
    }
}
