//! The ZooKeeper client library, as the real one (ClientCnxn, ZooKeeper 3.8) behaves.
//!
//! - It opens a session with a requested timeout; the server negotiates T.
//! - It pings every T/3. When it has heard nothing from the server for 2/3·T (its read timeout) it is
//!   `Disconnected` (Curator: SUSPENDED) and keeps trying to re-attach its session.
//! - It learns that its session `Expired` (Curator: LOST) only when a re-attach is refused: a client cut
//!   off from the server believes its session alive for as long as the cut lasts.
//! - A request unanswered within 2/3·T fails with `ConnectionLoss`: it may or may not have been applied.
//! - Watch notifications are handed to the watcher registered for that session and path. A change of
//!   connection state (disconnected, expired) reaches every watcher too, as the real client delivers
//!   state events to all of them: here their watch ends, and a recipe waiting on one looks again.
//! - Notifications travel as stream messages, which a short partition delays rather than loses (the
//!   real client's TCP connection; a reconnect would replay missed ones with SetWatches).
//! - Its timers run on the client's node: a paused client neither pings nor notices it is disconnected
//!   until it resumes — and then its application code may run first.
//!
//! The client records each change of its connection state in the history as `Session`.

use super::{SessionId, WatchEvent, ZkError, ZkOp, ZkReply, ZkRequest};
use crate::clock::sim_now_ns;
use crate::ctx::Background;
use crate::history::EventKind;
use crate::net::{CallError, Rpc};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// The connection state of a session, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    Connected,
    Disconnected,
    Expired,
}

/// Why a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// The server answered with an error.
    Zk(ZkError),
    /// No answer in time: the request may or may not have been applied.
    ConnectionLoss,
}

/// A one-shot watch: resolves with the event, or `None` if the session ended first.
#[derive(Debug)]
pub struct Watch(oneshot::Receiver<WatchEvent>);

impl Watch {
    pub async fn fired(self) -> Option<WatchEvent> {
        self.0.await.ok()
    }
}

/// Where a client lives and whom it talks to; its router is the node's ZooKeeper event router.
pub type ClientEnv = crate::backend::ClientEnv<Router>;

type Watchers = BTreeMap<(SessionId, String), Vec<oneshot::Sender<WatchEvent>>>;

/// Hands each notification that reaches a node to the watchers of its session — like the real client's
/// event thread, one per node, however many sessions the node has.
#[derive(Default)]
pub struct Router {
    watchers: RefCell<Watchers>,
    thread: RefCell<Option<Background>>,
}

impl Router {
    fn start(self: &Rc<Self>, rpc: &Rpc) {
        if self.thread.borrow().is_none() {
            *self.thread.borrow_mut() = Some(super::super::listen(rpc, self, Router::deliver));
        }
    }

    fn deliver(&self, event: WatchEvent) {
        let fired = self.watchers.borrow_mut().remove(&(event.session, event.path.clone())).unwrap_or_default();
        for watcher in fired {
            let _ = watcher.send(event.clone());
        }
    }

    /// End every watch of `session` (the real client tells watchers of a state change).
    fn end_watches(&self, session: SessionId) {
        self.watchers.borrow_mut().retain(|(s, _), _| *s != session);
    }
}

struct Shared {
    env: ClientEnv,
    session: SessionId,
    timeout: Duration,
    last_heard_ns: Cell<u64>,
    state: watch::Sender<ConnState>,
}

/// A session with the ZooKeeper server. Clones share it; its pinger stops when the last clone is
/// dropped.
#[derive(Clone)]
pub struct ZkClient {
    shared: Rc<Shared>,
    _pinger: Rc<Background>,
}

impl ZkClient {
    /// Open a session; `None` if the server did not answer within `requested`.
    pub async fn connect(env: ClientEnv, requested: Duration) -> Option<ZkClient> {
        let request = ZkRequest::Connect { requested_ms: requested.as_millis() as i64, session: None };
        let (session, timeout_ms) = match env.rpc.call(env.server, request, requested).await {
            Ok(ZkReply::Connected { session, timeout_ms }) => (session, timeout_ms),
            _ => return None,
        };
        let shared = Rc::new(Shared {
            env,
            session,
            timeout: Duration::from_millis(timeout_ms as u64),
            last_heard_ns: Cell::new(sim_now_ns()),
            state: watch::channel(ConnState::Connected).0,
        });
        shared.record("connected");
        shared.env.router.start(&shared.env.rpc);
        let pinger = Background::spawn(pinger(shared.clone()));
        Some(ZkClient { shared, _pinger: Rc::new(pinger) })
    }

    /// The negotiated session timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// The connection state, and its changes.
    pub fn state(&self) -> watch::Receiver<ConnState> {
        self.shared.state.subscribe()
    }

    /// Whether the session is known to be gone.
    pub fn expired(&self) -> bool {
        self.shared.now() == ConnState::Expired
    }

    /// Run one operation; with `watch` set, also return the watch it registered (if the server set one).
    pub async fn call(&self, op: ZkOp) -> Result<(ZkReply, Option<Watch>), ClientError> {
        let watch_path = match &op {
            ZkOp::Exists { path, watch: true }
            | ZkOp::GetData { path, watch: true }
            | ZkOp::GetChildren { path, watch: true } => Some(path.clone()),
            _ => None,
        };
        // Registered before the request leaves, so that no notification can overtake it.
        let watch = watch_path.as_ref().map(|p| self.shared.register(p));
        let reply = self.shared.request(ZkRequest::Op { session: self.shared.session, op }).await;
        match reply {
            Ok(ZkReply::Error(e)) => Err(ClientError::Zk(e)),
            Ok(reply) => Ok((reply, watch)),
            Err(CallError::Timeout) => Err(ClientError::ConnectionLoss),
        }
    }
}

impl Shared {
    fn record(&self, state: &str) {
        self.env.recorder.record(self.env.rpc.me(), EventKind::Session { state: state.into() });
    }

    /// The state now (copied out: a borrow held across a state change would deadlock the channel).
    fn now(&self) -> ConnState {
        *self.state.borrow()
    }

    fn set_state(&self, state: ConnState) {
        let current = self.now();
        if current == state || current == ConnState::Expired {
            return;
        }
        self.state.send_replace(state);
        self.record(match state {
            ConnState::Connected => "reconnected",
            ConnState::Disconnected => "disconnected",
            ConnState::Expired => "expired",
        });
        if state != ConnState::Connected {
            // Every watcher hears of the state change: its watch ends.
            self.env.router.end_watches(self.session);
        }
    }

    fn register(&self, path: &str) -> Watch {
        let (tx, rx) = oneshot::channel();
        self.env.router.watchers.borrow_mut().entry((self.session, path.to_string())).or_default().push(tx);
        Watch(rx)
    }

    /// Send a request within the read timeout; any answer shows the connection is alive.
    async fn request(&self, request: ZkRequest) -> Result<ZkReply, CallError> {
        let reply = self.env.rpc.call(self.env.server, request, self.timeout * 2 / 3).await?;
        self.last_heard_ns.set(sim_now_ns());
        match reply {
            ZkReply::Error(ZkError::SessionExpired) => self.set_state(ConnState::Expired),
            _ => self.set_state(ConnState::Connected),
        }
        Ok(reply)
    }
}

/// Ping every T/3; declare the connection lost after 2/3·T of silence; re-attach while disconnected.
async fn pinger(shared: Rc<Shared>) {
    let third = shared.timeout / 3;
    loop {
        shared.env.clock.sleep(third).await;
        let state = shared.now();
        match state {
            ConnState::Expired => return,
            ConnState::Connected => {
                let silent_ns = sim_now_ns() - shared.last_heard_ns.get();
                if silent_ns >= (shared.timeout * 2 / 3).as_nanos() as u64 {
                    shared.set_state(ConnState::Disconnected);
                }
            }
            ConnState::Disconnected => {}
        }
        // The ping (or re-attach) runs beside the loop, so a lost one does not delay the next check.
        let (shared2, state) = (shared.clone(), shared.now());
        madsim::task::spawn_local(async move {
            let request = match state {
                ConnState::Disconnected => ZkRequest::Connect {
                    requested_ms: shared2.timeout.as_millis() as i64,
                    session: Some(shared2.session),
                },
                _ => ZkRequest::Op { session: shared2.session, op: ZkOp::Ping },
            };
            let _ = shared2.request(request).await;
        });
    }
}
