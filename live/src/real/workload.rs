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
//!
//! **Deadlines.** Every request has one, [`Run::request_timeout`] (`[recipe] request_timeout`, default
//! [`super::REQUEST_TIMEOUT`]), counted in real time *outside faults*: while any fault is in force (from
//! its `FaultStart` to its `FaultEnd`) the clock stops, since a paused process cannot answer, and a
//! waiter behind a paused or cut-off holder, or a stopped server, legitimately waits. A request past its
//! deadline is a harness error naming the client and the request, during the run or at its end. `enter`
//! and `write` are acknowledgements the adapter owes at once: their deadline is [`super::ACK_TIMEOUT`]
//! (2 s) when `request_timeout` is longer, so a hang after a grant shows within a short run. The
//! end of the run cuts off the requests still within their deadline (an `acquire` waiting for the lock,
//! a `release` on a cut link): those are not errors.

use super::client::{ClientProcess, Line, Spawn};
use super::protocol::{Message, Request};
use super::Run;
use locksim_scenarios::workload::{Draws, Work};
use locksim_sim::history::{EventKind, NodeIx};
use locksim_sim::resource::{ResourceReply, ResourceRequest};
use std::time::Duration;

/// How a client process's session ended.
enum End {
    /// The run is over (or stopped).
    Over,
    /// The process ended (or closed its stdout), leaving this request unanswered, if any.
    Died(Option<Request>),
}

/// A request sent and not answered yet.
#[derive(Clone, Copy)]
struct Pending {
    request: Request,
    /// When it was sent, and how much fault time had passed then.
    sent: Duration,
    fault_time: Duration,
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
        if let End::Died(waiting) = end {
            if !crashed && !run.stopped() {
                return Err(anyhow::anyhow!(process.death(waiting.map(Request::name))));
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
        let mut draws = Draws::new(self.run.seed, 0, self.node, incarnation);
        let workload = &self.run.workload;
        while !self.run.over() && !self.sold_out {
            let shared = draws.shared(workload);
            self.record(EventKind::AcquireInvoke);
            match self.call(if shared { Request::AcquireShared } else { Request::Acquire })? {
                Answer::End(end) => return Ok(end),
                Answer::Message(Message::Ok { token }) => {
                    self.record(EventKind::AcquireOk { token, shared });
                    self.lost = false;
                    if let Some(end) = self.critical_section(token, shared, draws.time(workload.hold))? {
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
            if let Some(end) = self.idle(draws.time(workload.think))? {
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
        let work = Work::of(&self.run.workload, self.run.guard);
        let read = if work.is_atomic() {
            None
        } else {
            let read = ResourceRequest::Read { token, shared };
            let ResourceReply::Value(value) = self.access(read) else { return Ok(None) };
            if work.sold_out(value) {
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
        match read {
            Some(value) => {
                self.access(work.write(token, value));
            }
            None => {
                let reply = self.access(work.update(token));
                self.sold_out = work.buys() && matches!(reply, ResourceReply::Value(_));
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
        let pending = Pending { request, sent: self.run.elapsed(), fault_time: self.run.recorder.fault_time() };
        if !process.send(request) {
            return Ok(Answer::End(End::Died(Some(request))));
        }
        // Until the answer, the request's deadline, or the run's end.
        Ok(match self.wait(None, Some(pending))? {
            Got::Idle => Answer::End(End::Over),
            Got::End(End::Died(_)) => Answer::End(End::Died(Some(request))),
            Got::End(end) => Answer::End(end),
            Got::Message(m) => Answer::Message(m),
        })
    }

    /// A harness error if `pending` is past its deadline: real time since it was sent, less the time
    /// some fault was in force meanwhile.
    fn check_deadline(&self, pending: &Pending) -> anyhow::Result<()> {
        let now = self.run.elapsed();
        let faults = self.run.recorder.fault_time().saturating_sub(pending.fault_time);
        let waited = now.saturating_sub(pending.sent).saturating_sub(faults);
        let ack = pending.request.is_acknowledgement();
        let limit = if ack { self.run.request_timeout.min(super::ACK_TIMEOUT) } else { self.run.request_timeout };
        if waited <= limit {
            return Ok(());
        }
        let tail = self.process.as_deref().map_or(String::new(), |p| format!("; {}", p.stderr_tail()));
        Err(anyhow::anyhow!(
            "{}: no answer to {} within its deadline of {} ({}): sent at {:.2} s, unanswered at {:.2} s{}{tail}",
            self.run.nodes[self.node.0 as usize],
            pending.request.name(),
            locksim_sim::fault::fmt_duration(limit),
            if ack { "an acknowledgement, owed at once" } else { "[recipe] request_timeout" },
            pending.sent.as_secs_f64(),
            now.as_secs_f64(),
            if faults.is_zero() {
                String::new()
            } else {
                format!(" ({:.2} s of it under faults, not counted)", faults.as_secs_f64())
            },
        ))
    }

    /// Let `d` pass, hearing any `lost` notice; `Some` if the session ended meanwhile.
    fn idle(&mut self, d: Duration) -> anyhow::Result<Option<End>> {
        match self.wait(Some(self.run.elapsed() + d), None)? {
            Got::Idle => Ok(None),
            Got::End(end) => Ok(Some(end)),
            Got::Message(m) => Err(self.unexpected(&m, "nothing (an unprompted line)")),
        }
    }

    /// The next message other than `lost` (recorded as `LockLost` while holding), the end of the run or
    /// of the process, or `Idle` at `until`; a harness error once `pending` is past its deadline.
    fn wait(&mut self, until: Option<Duration>, pending: Option<Pending>) -> anyhow::Result<Got> {
        loop {
            let now = self.run.elapsed();
            if let Some(pending) = &pending {
                self.check_deadline(pending)?;
            }
            if self.run.over() {
                return Ok(Got::End(End::Over));
            }
            if until.is_some_and(|u| now >= u) {
                return Ok(Got::Idle);
            }
            let step = until.unwrap_or(self.run.end).min(now + Duration::from_millis(50)).min(self.run.end);
            let deadline = self.run.instant(step);
            let Some(process) = self.process.as_deref_mut() else {
                std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
                continue;
            };
            match process.next(deadline) {
                None => {}
                Some(Line::Closed | Line::Exited(_)) => return Ok(Got::End(End::Died(None))),
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
        anyhow::anyhow!(super::protocol::unexpected(&self.run.nodes[self.node.0 as usize].to_string(), m, to))
    }
}
