//! The etcd client library (clientv3, etcd 3.5), as recipes use it.
//!
//! - Unary calls (Range, Put, Txn, lease calls) wait for their reply until the request's deadline; one
//!   that times out may or may not have been applied.
//! - Watches ride the client's watch stream: their events are stream messages, which a short partition
//!   delays rather than loses, handed to each watcher by its id. Events for a watch id the client no
//!   longer has are answered with a cancel (clientv3 `watchGrpcStream.run`: "watch response on
//!   unexpected watch id; cancel id"), and a watch whose create call failed is cancelled at once: a
//!   finished `Lock` leaves no watch behind on the server.
//! - Every call rides one connection to the server (gRPC's). A restarted server resets it: the call
//!   fails unapplied (`Unavailable`), and the client reconnects and resumes each live watch from the
//!   revision after the last event it delivered (`watchGrpcStream` resuming its substreams), so events
//!   the old server never got to send are replayed by the new one. A server process that dies resets
//!   the calls in flight at once and refuses new ones until it is back (its kernel closes the
//!   connection and resets what comes). One task resumes the watches, trying again every 500 ms
//!   until each is back (`watchGrpcStream` opens its stream again once gRPC reconnects); a watch
//!   resumed once since the last reset is not sent again (the server would replay its events twice).
//! - Keep-alive (clientv3 `lessor`): the loop looks at once, then every 500 ms, and sends a keep-alive
//!   for a lease whose next keep-alive is due — TTL/3 after the last answer (counted from its
//!   keep-alive's sending: see `keep_alive_loop`), and at once until a first answer comes. An answer
//!   with TTL 0 means the server has no such lease any more: the keep-alive stops. So does a lease that
//!   has heard no answer for a whole TTL (`deadlineLoop`, checked every second). The holder of a lease
//!   learns of its loss only when its keep-alive stops, and the timers run on the client's node and its
//!   monotonic clock: a paused client notices nothing until it resumes.
//!
//! The client records the end of each keep-alive in the history as `Session`.

use super::{EtcdReply, EtcdRequest, LeaseId, WatchId, WatchResponse};

use crate::backend::LEASE_RENEW;
use crate::ctx::Background;
use crate::fault::TriggerEvent;
use crate::history::{EventKind, NodeIx};
use crate::net::{CallError, Rpc};
use crate::signal;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Where a client lives and whom it talks to; its router is the node's etcd watch stream.
pub type ClientEnv = crate::backend::ClientEnv<Router>;

/// A live watch as the client keeps it: where its events go, what it watches, and the revision to
/// resume it from.
struct Watched {
    events: mpsc::UnboundedSender<WatchResponse>,
    key: String,
    prefix: bool,
    next_revision: i64,
}

/// Which of a cluster's endpoints a clientv3 3.5 call goes to (its gRPC `round_robin` balancer): unary
/// calls take the endpoints in turn from one drawn at the start, passing over those whose connection
/// failed in the last second (gRPC's reconnect backoff starts at 1 s); the streams — watches and lease
/// keep-alives — ride one endpoint, and move to the next when a call on it fails. An endpoint that
/// takes calls and answers none (a paused or cut-off member) is not passed over: its calls time out.
/// The simulated client ([`Router`]) and real mode's share it.
#[derive(Debug)]
pub struct Balancer {
    stream: Cell<usize>,
    next: Cell<usize>,
    failed_ms: RefCell<Vec<Option<i64>>>,
}

/// gRPC's first reconnect backoff (`BaseDelay`).
const RECONNECT_MS: i64 = 1_000;

impl Balancer {
    /// `n` endpoints, the streams and the turn starting at `first`.
    pub fn new(n: usize, first: usize) -> Balancer {
        Balancer { stream: Cell::new(first), next: Cell::new(first), failed_ms: RefCell::new(vec![None; n]) }
    }

    /// The endpoint the streams ride.
    pub fn stream(&self) -> usize {
        self.stream.get()
    }

    /// The endpoint a unary call goes to at `now_ms`.
    pub fn unary(&self, now_ms: i64) -> usize {
        let failed = self.failed_ms.borrow();
        let n = failed.len();
        let ready = |k: &usize| failed[*k].is_none_or(|at| now_ms - at >= RECONNECT_MS);
        let start = self.next.get();
        let k = (start..start + n).map(|k| k % n).find(ready).unwrap_or(start % n);
        self.next.set((k + 1) % n);
        k
    }

    /// A call to endpoint `k` failed at `now_ms` (its connection reset or broke): unary calls pass it
    /// over for a while, and the streams, if they rode it, move to the next. Whether they moved.
    pub fn failed(&self, k: usize, now_ms: i64) -> bool {
        let mut failed = self.failed_ms.borrow_mut();
        failed[k] = Some(now_ms);
        let moved = failed.len() > 1 && self.stream.get() == k;
        if moved {
            self.stream.set((k + 1) % failed.len());
        }
        moved
    }
}

/// The node's connection to the server and its watch stream: hands each watch response to its watcher.
/// With several endpoints (a cluster's members) the calls are spread as clientv3's balancer spreads
/// them ([`Balancer`]); when the streams move to another endpoint the watches are resumed there.
pub struct Router {
    endpoints: Rc<[NodeIx]>,
    balancer: Balancer,
    /// This life of the node's watch stream (the server drops an older one's watchers).
    connection: u64,
    /// The life of the server each endpoint's connection is open to (`None`: none open).
    lives: RefCell<Vec<Option<u32>>>,
    /// A task is resuming the watches.
    resuming: Cell<bool>,
    /// Watches resumed on the current connection since the last reset.
    resumed: RefCell<std::collections::BTreeSet<WatchId>>,
    next_id: Cell<WatchId>,
    watchers: RefCell<BTreeMap<WatchId, Watched>>,
    thread: RefCell<Option<(Background, Rpc)>>,
}

impl Router {
    /// A router for a connection named `connection` (unique per node life, e.g. drawn at random) to
    /// `endpoints[first]`, then the next of `endpoints` each time it fails.
    pub fn new(connection: u64, endpoints: Rc<[NodeIx]>, first: usize) -> Router {
        Router {
            balancer: Balancer::new(endpoints.len(), first),
            lives: RefCell::new(vec![None; endpoints.len()]),
            endpoints,
            connection,
            resuming: Cell::new(false),
            resumed: RefCell::default(),
            next_id: Cell::new(1),
            watchers: RefCell::default(),
            thread: RefCell::default(),
        }
    }

    /// The endpoint the streams ride.
    fn server(&self) -> NodeIx {
        self.endpoints[self.balancer.stream()]
    }

    fn start(self: &Rc<Self>, rpc: &Rpc) {
        if self.thread.borrow().is_none() {
            let thread = super::super::listen(rpc, self, Router::deliver);
            *self.thread.borrow_mut() = Some((thread, rpc.clone()));
        }
    }

    fn deliver(&self, response: WatchResponse) {
        let mut watchers = self.watchers.borrow_mut();
        match watchers.get_mut(&response.watch_id) {
            Some(watched) => {
                if let Some(last) = response.events.last() {
                    watched.next_revision = last.kv.mod_revision + 1;
                }
                let _ = watched.events.send(response);
            }
            None => {
                if let Some((_, rpc)) = self.thread.borrow().as_ref() {
                    rpc.tell(self.server(), EtcdRequest::CancelWatch { id: response.watch_id });
                }
            }
        }
    }

    /// The server created watch `id`, asked from `start_revision`, at header revision `revision`.
    /// clientv3 keeps the revision a watch resumes from in `ws.initReq.rev` (`serveSubstream`): a watch
    /// "from now" (no start revision) takes the created response's header revision — "a current
    /// revision watch must resume at the store revision", so that a change committed while the stream
    /// is broken is not missed — and after each batch of events, the revision after its last
    /// ([`Router::deliver`]). Resuming at the header revision itself replays the change made at it, if
    /// it matches: real clientv3 does the same.
    fn created(&self, id: WatchId, start_revision: i64, revision: i64) {
        if let Some(w) = self.watchers.borrow_mut().get_mut(&id).filter(|_| start_revision == 0) {
            w.next_revision = revision;
        }
    }

    /// The requests that resume each live watch not resumed yet on the current connection.
    fn resumes(&self) -> Vec<EtcdRequest> {
        let resumed = self.resumed.borrow();
        let watchers = self.watchers.borrow();
        let live = watchers.iter().filter(|(id, _)| !resumed.contains(id));
        live.map(|(id, w)| EtcdRequest::Watch {
            id: *id,
            connection: self.connection,
            key: w.key.clone(),
            prefix: w.prefix,
            start_revision: w.next_revision,
        })
        .collect()
    }

    /// The connection was reset or broke: open a new one and resume every live watch on it — one task
    /// at a time, again every [`RESUME_RETRY`] while the server cannot be reached.
    async fn resume(self: Rc<Self>, client: EtcdClient) {
        if self.resuming.replace(true) {
            return;
        }
        loop {
            let watches = self.resumes();
            let mut failed = false;
            for watch in watches {
                let EtcdRequest::Watch { id, .. } = watch else { unreachable!("only watches") };
                match client.request(watch).await {
                    Ok(_) => drop(self.resumed.borrow_mut().insert(id)),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if !failed {
                break;
            }
            client.env.clock.sleep(RESUME_RETRY).await;
        }
        self.resuming.set(false);
    }
}

/// How often a client that cannot reach the server tries again to resume its watches.
const RESUME_RETRY: Duration = Duration::from_millis(500);

/// A client of the etcd server. Clones share the connection.
#[derive(Clone)]
pub struct EtcdClient {
    env: ClientEnv,
    /// The deadline of every unary call.
    timeout: Duration,
}

impl EtcdClient {
    pub fn new(env: ClientEnv, timeout: Duration) -> EtcdClient {
        env.router.start(&env.rpc);
        EtcdClient { env, timeout }
    }

    /// One call: a watch's or a keep-alive's on the streams' endpoint, another on the endpoint whose
    /// turn it is ([`Balancer`]). A reset (the server restarted) reconnects, and the call fails
    /// unapplied; a broken connection (a lost reply) does the same, the call's fate unknown. When the
    /// streams' connection fails they move to the next endpoint, if there are several, and the watches
    /// are resumed.
    pub async fn request(&self, request: EtcdRequest) -> Result<EtcdReply, CallError> {
        let router = &self.env.router;
        let streamed = matches!(
            request,
            EtcdRequest::Watch { .. } | EtcdRequest::CancelWatch { .. } | EtcdRequest::LeaseKeepAlive { .. }
        );
        let now_ms = || self.env.clock.monotonic_ms();
        let k = if streamed { router.balancer.stream() } else { router.balancer.unary(now_ms()) };
        let life = router.lives.borrow()[k];
        match self.env.rpc.call_on(router.endpoints[k], None, life, request, self.timeout).await {
            Ok((reply, life)) => {
                router.lives.borrow_mut()[k] = Some(life);
                Ok(reply)
            }
            Err(e @ (CallError::Reset | CallError::Broken)) => {
                let was_open = router.lives.borrow_mut()[k].take().is_some();
                // Unless a call that failed before this one has moved the streams already.
                let streams = k == router.balancer.stream();
                let moved = router.balancer.failed(k, now_ms());
                if streams && (was_open || moved) {
                    router.resumed.borrow_mut().clear();
                    madsim::task::spawn_local(router.clone().resume(self.clone()));
                }
                // A cluster's member may have forwarded the request to its leader before it died: the
                // leader may still commit it, so a reset says nothing of its fate.
                if router.endpoints.len() > 1 {
                    return Err(CallError::Broken);
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Watch `key` (or every key under it) from `start_revision` (0: from the next change).
    pub async fn watch(&self, key: &str, prefix: bool, start_revision: i64) -> Result<Watcher, CallError> {
        let router = &self.env.router;
        let id = router.next_id.get();
        router.next_id.set(id + 1);
        // Registered before the request leaves: a watch from the past is answered with events at once.
        let (tx, events) = mpsc::unbounded_channel();
        let watched = Watched { events: tx, key: key.into(), prefix, next_revision: start_revision };
        router.watchers.borrow_mut().insert(id, watched);
        // Dropped on failure: the watch is cancelled, in case the server got the request after all.
        let watcher = Watcher { events, cancel: Cancel::Sim { id, env: self.env.clone() } };
        let request = EtcdRequest::Watch { id, connection: router.connection, key: key.into(), prefix, start_revision };
        if let EtcdReply::WatchCreated { revision, .. } = self.request(request).await? {
            router.created(id, start_revision, revision);
        }
        Ok(watcher)
    }

    /// Keep `lease` alive in the background until the server says it is gone or answers stop for a TTL.
    pub fn keep_alive(&self, lease: LeaseId, ttl: Duration) -> KeepAlive {
        KeepAlive::start(self.clone(), lease, ttl)
    }
}

/// What one lease's keep-alive loop runs on: a client's keep-alive call, its node's monotonic clock, and
/// where the loop and its answers run. The simulated client ([`EtcdClient`]) and a real one share the
/// loop ([`KeepAlive::start`]): only these differ.
pub trait Lessor: Clone + 'static {
    /// One `LeaseKeepAlive` and its answer.
    fn keep_alive_once(&self, lease: LeaseId) -> impl Future<Output = Result<EtcdReply, CallError>>;
    fn monotonic_ms(&self) -> i64;
    fn sleep(&self, d: Duration) -> impl Future<Output = ()>;
    /// Run `task` in the background until it ends, or until the handle is dropped.
    fn spawn(&self, task: impl Future<Output = ()> + 'static) -> Background;
    /// Run `task` to its end beside the caller, detached.
    fn spawn_detached(&self, task: impl Future<Output = ()> + 'static);
    /// The keep-alive of `lease` has stopped, for `why` (a simulated client records it in the history).
    fn stopped(&self, lease: LeaseId, why: &str);
    /// The loop is about to send a keep-alive: the point [`LEASE_RENEW`] (a real process has no armed
    /// faults, and passes it without a stop).
    fn renewal_due(&self) -> impl Future<Output = ()> {
        std::future::ready(())
    }
}

impl Lessor for EtcdClient {
    fn keep_alive_once(&self, lease: LeaseId) -> impl Future<Output = Result<EtcdReply, CallError>> {
        self.request(EtcdRequest::LeaseKeepAlive { id: lease })
    }

    fn monotonic_ms(&self) -> i64 {
        self.env.clock.monotonic_ms()
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> {
        self.env.clock.sleep(d)
    }

    fn spawn(&self, task: impl Future<Output = ()> + 'static) -> Background {
        Background::spawn(task)
    }

    fn spawn_detached(&self, task: impl Future<Output = ()> + 'static) {
        madsim::task::spawn_local(task);
    }

    fn stopped(&self, lease: LeaseId, why: &str) {
        let state = format!("keep-alive of lease {lease:x} stopped: {why}");
        self.env.recorder.record(self.env.rpc.me(), EventKind::Session { state });
    }

    fn renewal_due(&self) -> impl Future<Output = ()> {
        self.env.recorder.pass(self.env.rpc.me(), TriggerEvent::Declared(&LEASE_RENEW))
    }
}

/// A watch; dropping it cancels it on the server.
pub struct Watcher {
    events: mpsc::UnboundedReceiver<WatchResponse>,
    cancel: Cancel,
}

/// How a dropped watch is cancelled.
enum Cancel {
    /// A simulated client's: forget the id and tell the server.
    Sim { id: WatchId, env: ClientEnv },
    /// A real client's: the task reading the watch's own stream is aborted, which closes the stream and
    /// so the watch (the gRPC gateway cancels a watch whose HTTP stream is gone).
    Stream { _reader: Background },
}

impl Watcher {
    /// A watch fed by `reader`, a task of a real client that reads the watch's stream into `events`.
    pub fn streamed(events: mpsc::UnboundedReceiver<WatchResponse>, reader: Background) -> Watcher {
        Watcher { events, cancel: Cancel::Stream { _reader: reader } }
    }

    /// The next batch of events (never `None` while the watcher lives).
    pub async fn next(&mut self) -> Option<WatchResponse> {
        self.events.recv().await
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Cancel::Sim { id, env } = &self.cancel {
            env.router.watchers.borrow_mut().remove(id);
            env.rpc.tell(env.router.server(), EtcdRequest::CancelWatch { id: *id });
        }
    }
}

/// A lease kept alive in the background; dropping it stops the keep-alive (the lease then expires
/// unless revoked).
pub struct KeepAlive {
    done: signal::Receiver<Option<String>>,
    _task: Background,
}

impl KeepAlive {
    /// Keep `lease` (granted for `ttl`) alive on `lessor` in the background.
    pub fn start(lessor: impl Lessor, lease: LeaseId, ttl: Duration) -> KeepAlive {
        let (tx, done) = signal::channel(None);
        let task = lessor.spawn(keep_alive_loop(lessor.clone(), lease, ttl, tx));
        KeepAlive { done, _task: task }
    }

    /// Resolves, with the reason, when the keep-alive has stopped.
    pub async fn stopped(&self) -> String {
        let mut done = self.done.clone();
        let reason = match done.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    pub fn has_stopped(&self) -> bool {
        self.done.borrow().is_some()
    }
}

/// The end of one lease's keep-alive, said once.
struct Ending<L> {
    lease: LeaseId,
    done: signal::Sender<Option<String>>,
    lessor: L,
}

impl<L: Lessor> Ending<L> {
    fn stop(&self, why: &str) {
        if self.done.borrow().is_none() {
            self.lessor.stopped(self.lease, why);
            self.done.send_replace(Some(why.to_string()));
        }
    }

    fn stopped(&self) -> bool {
        self.done.borrow().is_some()
    }
}

/// clientv3's `sendKeepAliveLoop`, `recvKeepAlive` and `deadlineLoop` for one lease, on the node's
/// monotonic clock.
async fn keep_alive_loop<L: Lessor>(lessor: L, lease: LeaseId, ttl: Duration, done: signal::Sender<Option<String>>) {
    const SEND_EVERY: Duration = Duration::from_millis(500);
    // (next keep-alive due, deadline): due at once, and the first answer must come within a TTL.
    let now = lessor.monotonic_ms();
    let timing = Rc::new(Cell::new((now, now + ttl.as_millis() as i64)));
    let ending = Rc::new(Ending { lease, done, lessor: lessor.clone() });
    // `sendKeepAliveLoop` looks at once when its stream opens, then every 500 ms; `deadlineLoop`
    // every second from the first `KeepAlive` call.
    for tick in 0u64.. {
        if tick > 0 {
            lessor.sleep(SEND_EVERY).await;
        }
        let now = lessor.monotonic_ms();
        let (next, deadline) = timing.get();
        if tick > 0 && tick.is_multiple_of(2) && now > deadline {
            ending.stop("no answer for the lease TTL");
        }
        if ending.stopped() {
            return;
        }
        if now < next {
            continue;
        }
        lessor.renewal_due().await;
        // The answer is handled beside the loop, as the real client's receive loop does; once the
        // keep-alive is dropped, a late answer finds nobody (the real client forgets the lease).
        let (client, timing, ending) = (lessor.clone(), timing.clone(), Rc::downgrade(&ending));
        lessor.spawn_detached(async move {
            let sent = client.monotonic_ms();
            let answer = client.keep_alive_once(lease).await;
            let Some(ending) = ending.upgrade() else { return };
            match answer {
                Ok(EtcdReply::KeepAlive { ttl_s, .. }) if ttl_s <= 0 => {
                    ending.stop("the server says the lease has expired")
                }
                Ok(EtcdReply::KeepAlive { ttl_s, .. }) => {
                    // clientv3 counts TTL/3 from the answer, and its looks drift late by the loop's
                    // own work and Go's timer latency — about half a millisecond a look on a real
                    // machine, more than a LAN's round trip — so a keep-alive due TTL/3 after an answer
                    // that falls on a look goes at that look (`etcdctl lease keep-alive` with TTL 3 s
                    // answers at 0, 1.00, 2.00, 3.00 s). Counted from the answer, this network's round
                    // trip of milliseconds would put every such keep-alive a look (500 ms) later.
                    let now = client.monotonic_ms();
                    timing.set((sent + ttl_s * 1000 / 3, now + ttl_s * 1000));
                }
                _ => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, EventType, KeyValue};
    use super::*;

    fn resumes_from(router: &Router) -> Vec<i64> {
        let from = |r: EtcdRequest| match r {
            EtcdRequest::Watch { start_revision, .. } => start_revision,
            other => unreachable!("{other:?}"),
        };
        router.resumes().into_iter().map(from).collect()
    }

    #[test]
    fn unary_calls_take_the_members_in_turn_and_pass_over_a_failed_one_for_a_second() {
        let b = Balancer::new(3, 1);
        let turns: Vec<usize> = (0..4).map(|_| b.unary(0)).collect();
        assert_eq!(turns, [1, 2, 0, 1], "round robin from the drawn member");
        assert!(!b.failed(2, 100), "the streams ride member 1, not 2");
        let turns: Vec<usize> = (0..3).map(|_| b.unary(500)).collect();
        assert_eq!(turns, [0, 1, 0], "member 2 passed over while it reconnects");
        let turns: Vec<usize> = (0..2).map(|_| b.unary(1_100)).collect();
        assert_eq!(turns, [1, 2], "and taken again a second after it failed");
        assert!(b.failed(1, 1_200), "the streams' member failed: they move");
        assert_eq!(b.stream(), 2);
        let one = Balancer::new(1, 0);
        assert!(!one.failed(0, 0), "a single endpoint: the streams stay");
        assert_eq!(one.unary(0), 0, "and every call goes to it, failed or not");
    }

    #[test]
    fn a_watch_from_now_resumes_at_the_header_revision_it_was_created_at() {
        let router = Router::new(1, Rc::from([NodeIx(0)]), 0);
        let (events, _rx) = mpsc::unbounded_channel();
        let watched = Watched { events, key: "k".into(), prefix: false, next_revision: 0 };
        router.watchers.borrow_mut().insert(1, watched);
        router.created(1, 0, 7);
        assert_eq!(resumes_from(&router), [7], "clientv3: nextRev = wr.Header.Revision");
        let kv = KeyValue { key: "k".into(), mod_revision: 9, ..KeyValue::default() };
        router.deliver(WatchResponse { watch_id: 1, revision: 9, events: vec![Event { kind: EventType::Put, kv }] });
        assert_eq!(resumes_from(&router), [10], "after its last event");
    }
}
