//! The resource service of a real run: the simulator's [`ResourceState`], driven by real-time requests.
//!
//! In this slice locksim makes each access on the client's behalf at the moment the client process
//! answers `enter` (the read) or `write` (the write), so a paused holder's write lands when it resumes.
//! The events are the simulator's, recorded through [`ResourceState`]'s `apply`.

use super::history::Recorder;
use locksim_sim::backend::{Backend, Now, Out};
use locksim_sim::history::NodeIx;
use locksim_sim::resource::{ResourceReply, ResourceRequest, ResourceState};
use std::sync::Mutex;

pub struct Resource {
    state: Mutex<ResourceState>,
}

impl Resource {
    /// The counter at 0, or a flash sale's stock.
    pub fn new(fencing: bool, value: i64) -> Resource {
        Resource { state: Mutex::new(ResourceState::new(fencing, value)) }
    }

    /// Apply one access by `client` now, recording its events (under the resource's lock, so that the
    /// order of accesses is the order of their events).
    pub fn apply(&self, recorder: &Recorder, client: NodeIx, request: ResourceRequest) -> ResourceReply {
        let mut state = self.state.lock().expect("resource lock");
        let mut out = Out::default();
        let now = Now::at(recorder.elapsed().as_millis() as i64);
        let reply = state.apply(now, client, request, &mut out);
        for (node, kind) in out.events {
            recorder.record(node, kind);
        }
        reply
    }
}
