//! Simulated servers: sans-IO state machines behind one thin node shell.
//!
//! A backend is a synchronous state machine: [`Backend::apply`] takes the server's wall-clock time, the
//! caller and a request, and returns the reply. It does no I/O, never sleeps and draws no randomness, so
//! it is unit-tested with plain tables of requests and replies. [`serve`] is the shell every backend
//! shares: receive, apply, record, reply. Faults act on the shell's node (pause, crash, lost replies),
//! never inside the state machine.

pub mod redis;

use crate::clock::Clock;
use crate::history::{EventKind, NodeIx, Recorder};
use crate::net::Rpc;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// Events a state machine asks the shell to record, each about a node (usually the caller).
pub type Out = Vec<(NodeIx, EventKind)>;

/// A server's state machine.
pub trait Backend: Send + 'static {
    type Request: Any + Send;
    type Reply: Any + Send;

    /// Apply one request at `now_ms` by the server's own clock.
    fn apply(&mut self, now_ms: i64, from: NodeIx, request: Self::Request, out: &mut Out) -> Self::Reply;
}

/// Serve `state` on this node until the node dies.
pub async fn serve<B: Backend>(state: Arc<Mutex<B>>, rpc: &Rpc, clock: &Clock, recorder: &Recorder) {
    let mut out = Out::new();
    loop {
        let (reply_to, request) = rpc.next_request::<B::Request>().await;
        let reply = state.lock().expect("backend lock").apply(clock.now_ms(), reply_to.from, request, &mut out);
        for (node, kind) in out.drain(..) {
            recorder.record(node, kind);
        }
        rpc.reply(&reply_to, reply);
    }
}
