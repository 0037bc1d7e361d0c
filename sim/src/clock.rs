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

use madsim::time::{Instant, TimeHandle};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

thread_local! {
    /// The running world's time source, kept by [`TimeCache`]: `TimeHandle::current()` clones two `Arc`s
    /// (and drops them) on every reading, and time is read on every message and event.
    static TIME: RefCell<Option<Source>> = const { RefCell::new(None) };
}

/// A runtime's time source, and what [`wake_at`] needs to add a timer cheaply.
struct Source {
    handle: TimeHandle,
    /// madsim's instant at simulated time 0: its timers are set in instants.
    zero: Instant,
    /// A timer that [`wake_at`] resets to each deadline and polls once, which adds one entry to
    /// madsim's heap — rather than making (and dropping) a `Sleep` for every message.
    arm: madsim::time::Sleep,
}

impl Source {
    fn current() -> Source {
        let handle = TimeHandle::current();
        let zero = handle.now_instant() - handle.elapsed();
        Source { arm: handle.sleep_until(zero), handle, zero }
    }
}

/// Nanoseconds of simulated time since the world started.
pub fn sim_now_ns() -> u64 {
    let elapsed = TIME.with(|t| t.borrow().as_ref().map(|s| s.handle.elapsed()));
    elapsed.unwrap_or_else(|| TimeHandle::current().elapsed()).as_nanos() as u64
}

/// Where a timer's wake-up goes: the waker of the task waiting on it now, or nowhere once nobody waits.
///
/// madsim's timers cannot be cancelled (its `naive_timer` heap only expires), and its `Sleep` adds a
/// new timer every time it is polled while pending. A task that waits on a call's timeout and then
/// on its reply, or in a `select!`, piles up timers that each wake it later for nothing — and every
/// wake-up is a poll, a draw from madsim's generator and a step of its clock. A timer that wakes
/// through a slot is added once, and once its waiter has gone it wakes nobody.
pub(crate) struct WakeSlot(Mutex<Option<Waker>>);

impl WakeSlot {
    pub(crate) fn new() -> Arc<WakeSlot> {
        Arc::new(WakeSlot(Mutex::new(None)))
    }

    /// `waker` is the one to wake now (a task is polled with the same waker each time, so this rarely
    /// clones).
    pub(crate) fn set(&self, waker: &Waker) {
        let mut slot = self.0.lock().expect("wake slot lock");
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }

    /// Nobody waits any more: a timer that fires now wakes no one.
    pub(crate) fn clear(&self) {
        self.0.lock().expect("wake slot lock").take();
    }
}

impl Wake for WakeSlot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waker = self.0.lock().expect("wake slot lock").take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Wake whoever waits in `slot` when `at_ns` of simulated time comes (at once if it has come): one
/// entry in madsim's timer heap, added the only way madsim offers — by polling its `Sleep`, here with
/// the slot as its waker. The network calls this while it is locked, with times still to come (a
/// message takes at least 1 ms; a deadline that has passed has woken its caller already): a waker that
/// locks the network (`net::Callers`) must never be woken from here at once.
pub(crate) fn wake_at<W: Wake + Send + Sync + 'static>(at_ns: u64, slot: &Arc<W>) {
    let waker = Waker::from(slot.clone());
    let mut cx = Context::from_waker(&waker);
    let due = TIME.with(|t| {
        let mut source = t.borrow_mut();
        let source = source.as_mut()?;
        let mut arm = Pin::new(&mut source.arm);
        arm.as_mut().reset(source.zero + Duration::from_nanos(at_ns));
        Some(arm.poll(&mut cx).is_ready())
    });
    let due = due.unwrap_or_else(|| {
        let mut timer = madsim::time::sleep(Duration::from_nanos(at_ns.saturating_sub(sim_now_ns())));
        Pin::new(&mut timer).poll(&mut cx).is_ready()
    });
    if due {
        slot.wake_by_ref();
    }
}

/// A sleep of `d` (at least 1 ms, as madsim's and tokio's are) whose timer is added once, however often
/// it is polled, and wakes nobody once it is dropped (see [`WakeSlot`]). Its deadline is fixed when it
/// is made.
pub(crate) fn sleep(d: Duration) -> Sleep {
    let deadline_ns = sim_now_ns() + d.max(Duration::from_millis(1)).as_nanos() as u64;
    Sleep { deadline_ns, armed: None }
}

/// See [`sleep`].
pub(crate) struct Sleep {
    deadline_ns: u64,
    /// Set once the timer is in madsim's heap.
    armed: Option<Arc<WakeSlot>>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if sim_now_ns() >= self.deadline_ns {
            if let Some(slot) = self.armed.take() {
                slot.clear();
            }
            return Poll::Ready(());
        }
        match &self.armed {
            Some(slot) => slot.set(cx.waker()),
            None => {
                let slot = WakeSlot::new();
                slot.set(cx.waker());
                wake_at(self.deadline_ns, &slot);
                self.armed = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(slot) = &self.armed {
            slot.clear();
        }
    }
}

/// Keeps the current runtime's time source for [`sim_now_ns`] on this thread while it lives (a world
/// holds one; it is made and dropped inside the runtime's `block_on`). Without one, every reading asks
/// madsim for the current runtime.
pub(crate) struct TimeCache {
    previous: Option<Source>,
}

impl TimeCache {
    /// Call inside a madsim runtime.
    pub(crate) fn install() -> TimeCache {
        TimeCache { previous: TIME.with(|t| t.borrow_mut().replace(Source::current())) }
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
    /// The clock of a host booted `uptime` before the run: its monotonic clock reads `uptime` at
    /// simulated time 0, as Linux's `CLOCK_MONOTONIC` counts from boot (and Java's `System.nanoTime`,
    /// which ZooKeeper's session tracker rounds to ticks of, reads it). Wall time is unchanged.
    pub fn booted_ago(uptime: Duration) -> Clock {
        let clock = Clock::default();
        clock.0.lock().expect("clock lock").mono_at_anchor_ns = uptime.as_nanos() as i64;
        clock
    }

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

    /// The monotonic clock in milliseconds at simulated instant `sim_ns` (earlier ones at the current
    /// rate: close enough for the few milliseconds a kernel's timestamps look back).
    pub fn monotonic_ms_at(&self, sim_ns: u64) -> i64 {
        let s = self.0.lock().expect("clock lock");
        let since_anchor = (sim_ns as i64 - s.anchor_ns as i64) as f64 * s.rate;
        (s.mono_at_anchor_ns + since_anchor as i64).div_euclid(1_000_000)
    }

    /// Wall time in nanoseconds at a given simulated instant.
    pub fn wall_ns_at(&self, sim_ns: u64) -> i64 {
        self.0.lock().expect("clock lock").wall_ns(sim_ns)
    }

    /// How long simulated time must pass for this node's timers to measure `d`.
    pub fn real_duration(&self, d: Duration) -> Duration {
        let rate = self.0.lock().expect("clock lock").rate;
        // Through u64: a u128 converts to f64 in software, and no duration here nears 2^64 ns.
        Duration::from_nanos((d.as_nanos() as u64 as f64 / rate) as u64)
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
    fn a_host_booted_earlier_reads_its_uptime_on_the_monotonic_clock_only() {
        in_world(async {
            let c = Clock::booted_ago(Duration::from_millis(1234));
            madsim::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(c.readings_ms(), (1000, 2234));
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
