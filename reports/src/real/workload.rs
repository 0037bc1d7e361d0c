//! The workload of a real run, one thread per client, as `scenarios/src/workload.rs` runs it in the
//! simulator, with hold and think drawn from the same `Workload` stream of the seed (per client and
//! incarnation): acquire → enter (read) → hold → write → release → think. The counter writes the value
//! plus one; a flash sale's buyer writes the stock minus one with an order, and goes home once it has
//! seen the stock sold out; under `sql.conditional-update` the write is one conditional update and
//! there is no read. With `reads`, that share of acquisitions is shared
//! (`{"op":"acquire","shared":true}`), drawn from the same stream before each acquisition as the
//! simulator draws it, and a shared holder only reads. Every lock event is recorded when its line is
//! sent or read.
//!
//! A baseline's client (`none`, `sql.conditional-update`) has no process: every call succeeds at once
//! ([`Request::unguarded`]), and only the resource's accesses race.

use super::client::{ClientProcess, Line, Spawn};
use super::protocol::{Message, Request};
use super::Run;
use locksim_locks::Guard;
use locksim_sim::history::{EventKind, NodeIx};
use locksim_sim::resource::{ResourceReply, ResourceRequest};
use locksim_sim::rng::{stream, Rng, Stream};
use std::time::Duration;

/// How a client process's session ended.
enum End {
    /// The run is over (or stopped).
    Over,
    /// The process died (its stdout closed).
    Died,
}

/// The answer to a request, or the end of the session.
enum Answer {
    Message(Message),
    End(End),
}

/// What waiting for a line gave.
enum Got {
    Message(Message),
    End(End),
    /// The time asked for passed.
    Idle,
}

/// A hold or think time from the client's stream, as the simulator draws it.
fn draw(rng: &mut impl Rng, (lo, hi): (Duration, Duration)) -> Duration {
    if hi <= lo {
        lo
    } else {
        Duration::from_nanos(rng.gen_range(lo.as_nanos() as u64..=hi.as_nanos() as u64))
    }
}

/// One client for the whole run: its processes, one after another when a crash restarts it.
pub fn client(run: &Run, index: usize) -> anyhow::Result<()> {
    let node = NodeIx((index + run.first_client()) as u32);
    if run.argv.is_empty() {
        // A baseline: no process, and so no fault that could end its one session early.
        Session { run, node, process: None, lost: false, sold_out: false }.go(0)?;
        return Ok(());
    }
    let name = run.nodes[node.0 as usize].clone();
    let slot = &run.slots[index];
    let env = run.env(&name);
    let spawn = Spawn { client: &name, argv: &run.argv, dir: &run.dir, env: &env };
    for incarnation in 0u64.. {
        let mut process = ClientProcess::spawn(&spawn)?;
        slot.lock().expect("slot lock").pid = Some(process.pid());
        let end = Session { run, node, process: Some(&mut process), lost: false, sold_out: false }.go(incarnation);
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                slot.lock().expect("slot lock").pid = None;
                return Err(e);
            }
        };
        let crashed = {
            let mut s = slot.lock().expect("slot lock");
            s.pid = None;
            s.down.is_some()
        };
        if let End::Died = end {
            if !crashed && !run.stopped() {
                return Err(anyhow::anyhow!(process.death()));
            }
        }
        drop(process);
        // Down until its crash fault restarts it (`down` lifted), or for good.
        loop {
            if !run.sleep_until(run.elapsed() + Duration::from_millis(20)) {
                return Ok(());
            }
            if slot.lock().expect("slot lock").down.is_none() {
                break;
            }
        }
    }
    Ok(())
}

struct Session<'a> {
    run: &'a Run,
    node: NodeIx,
    /// `None`: a baseline's client, which has no lock to ask.
    process: Option<&'a mut ClientProcess>,
    /// The process said `lost` during the current hold.
    lost: bool,
    /// A flash sale's buyer has seen the stock run out: it goes home.
    sold_out: bool,
}

impl Session<'_> {
    fn go(mut self, incarnation: u64) -> anyhow::Result<End> {
        let mut rng = stream(self.run.seed, Stream::Workload, (u64::from(self.node.0) << 16) | incarnation);
        let workload = &self.run.workload;
        while !self.run.over() && !self.sold_out {
            // Drawn first, and only when the scenario has readers, as the simulator draws it.
            let shared = workload.reads > 0.0 && rng.gen_bool(workload.reads);
            self.record(EventKind::AcquireInvoke);
            match self.call(if shared { Request::AcquireShared } else { Request::Acquire })? {
                Answer::End(end) => return Ok(end),
                Answer::Message(Message::Ok { token }) => {
                    self.record(EventKind::AcquireOk { token, shared });
                    self.lost = false;
                    if let Some(end) = self.critical_section(token, shared, draw(&mut rng, workload.hold))? {
                        return Ok(end);
                    }
                    self.record(EventKind::ReleaseInvoke);
                    let kind = match self.call(Request::Release)? {
                        Answer::End(end) => return Ok(end),
                        Answer::Message(Message::Ok { .. }) => EventKind::ReleaseOk,
                        Answer::Message(Message::Fail { reason }) => EventKind::ReleaseFail { reason },
                        Answer::Message(Message::Unknown { reason }) => EventKind::ReleaseUnknown { reason },
                        Answer::Message(other) => return Err(self.unexpected(&other, "release")),
                    };
                    self.record(kind);
                }
                Answer::Message(Message::Fail { reason }) => self.record(EventKind::AcquireFail { reason }),
                Answer::Message(Message::Unknown { reason }) => self.record(EventKind::AcquireUnknown { reason }),
                Answer::Message(other) => return Err(self.unexpected(&other, "acquire")),
            }
            if let Some(end) = self.idle(draw(&mut rng, workload.think))? {
                return Ok(end);
            }
        }
        Ok(End::Over)
    }

    /// enter → read → hold → write (a shared holder only reads), each access when the process answers;
    /// `Some` if the session ended.
    fn critical_section(&mut self, token: Option<u64>, shared: bool, hold: Duration) -> anyhow::Result<Option<End>> {
        match self.call(Request::Enter)? {
            Answer::End(end) => return Ok(Some(end)),
            Answer::Message(Message::Entered) => {}
            Answer::Message(other) => return Err(self.unexpected(&other, "enter")),
        }
        if self.lost {
            return Ok(None);
        }
        let buy = self.run.workload.stock.is_some();
        let atomic = self.run.guard == Guard::ConditionalUpdate;
        let read = if atomic {
            None
        } else {
            let read = ResourceRequest::Read { token, shared };
            let ResourceReply::Value(value) = self.access(read) else { return Ok(None) };
            if buy && value <= 0 {
                self.sold_out = true;
                return Ok(None);
            }
            Some(value)
        };
        if let Some(end) = self.idle(hold)? {
            return Ok(Some(end));
        }
        if self.lost || shared {
            return Ok(None);
        }
        match self.call(Request::Write)? {
            Answer::End(end) => return Ok(Some(end)),
            Answer::Message(Message::Writing) => {}
            Answer::Message(other) => return Err(self.unexpected(&other, "write")),
        }
        if self.lost {
            return Ok(None);
        }
        let step = if buy { -1 } else { 1 };
        match read {
            Some(value) => {
                self.access(ResourceRequest::Write { token, value: value + step, order: buy });
            }
            // `UPDATE stock SET n = n - 1 WHERE n > 0`: an unchanged value means sold out.
            None => {
                let floor = buy.then_some(0);
                let reply = self.access(ResourceRequest::Add { token, delta: step, floor, order: buy });
                self.sold_out = buy && matches!(reply, ResourceReply::Value(_));
            }
        }
        Ok(None)
    }

    fn access(&self, request: ResourceRequest) -> ResourceReply {
        self.run.resource.apply(&self.run.recorder, self.node, request)
    }

    /// Send `request` and wait for its answer until the run ends.
    fn call(&mut self, request: Request) -> anyhow::Result<Answer> {
        let Some(process) = self.process.as_deref_mut() else {
            return Ok(if self.run.over() { Answer::End(End::Over) } else { Answer::Message(request.unguarded()) });
        };
        if !process.send(request) {
            return Ok(Answer::End(End::Died));
        }
        // Without a time limit only the run's end stops the wait.
        Ok(match self.wait(None)? {
            Got::Idle => Answer::End(End::Over),
            Got::End(end) => Answer::End(end),
            Got::Message(m) => Answer::Message(m),
        })
    }

    /// Let `d` pass, hearing any `lost` notice; `Some` if the session ended meanwhile.
    fn idle(&mut self, d: Duration) -> anyhow::Result<Option<End>> {
        match self.wait(Some(self.run.elapsed() + d))? {
            Got::Idle => Ok(None),
            Got::End(end) => Ok(Some(end)),
            Got::Message(m) => Err(self.unexpected(&m, "nothing (an unprompted line)")),
        }
    }

    /// The next message other than `lost` (recorded as `LockLost` while holding), the end of the run or
    /// of the process, or `Idle` at `until`.
    fn wait(&mut self, until: Option<Duration>) -> anyhow::Result<Got> {
        loop {
            let now = self.run.elapsed();
            if self.run.over() {
                return Ok(Got::End(End::Over));
            }
            if until.is_some_and(|u| now >= u) {
                return Ok(Got::Idle);
            }
            let step = until.unwrap_or(self.run.end).min(now + Duration::from_millis(50)).min(self.run.end);
            let deadline = self.run.instant(step);
            let Some(process) = self.process.as_deref() else {
                std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
                continue;
            };
            match process.next(deadline) {
                None => {}
                Some(Line::Closed) => return Ok(Got::End(End::Died)),
                Some(Line::Bad(e)) => return Err(e.into()),
                Some(Line::Message(Message::Lost { reason })) => self.heard_lost(reason),
                // A line read once the run is over may answer what another client's end of run set off
                // (its process killed, its lock freed): it belongs to no run.
                Some(Line::Message(_)) if self.run.over() => return Ok(Got::End(End::Over)),
                Some(Line::Message(m)) => return Ok(Got::Message(m)),
            }
        }
    }

    /// A `lost` notice counts while the client holds the lock, once per hold; otherwise it is old news.
    fn heard_lost(&mut self, reason: String) {
        if self.run.recorder.holders().contains(&self.node) && !self.lost {
            self.lost = true;
            self.record(EventKind::LockLost { reason });
        }
    }

    fn record(&self, kind: EventKind) {
        self.run.recorder.record(self.node, kind);
    }

    fn unexpected(&self, m: &Message, to: &str) -> anyhow::Error {
        anyhow::anyhow!("{}: the command answered {m:?} to {to}", self.run.nodes[self.node.0 as usize])
    }
}
