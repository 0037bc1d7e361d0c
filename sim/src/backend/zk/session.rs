//! Sessions (ZooKeeper 3.8 SessionTrackerImpl): negotiated timeouts and expiry in tickTime buckets.
//!
//! The server negotiates a client's requested timeout into [2, 20] × tickTime. Every request or ping
//! renews the session: it now expires at `now + timeout`, rounded up to the next multiple of tickTime
//! (ZooKeeper's ExpiryQueue), and the tick at that time expires it. What a session owns (its
//! ephemerals, where its events go) is the database's (`replica.rs`).

use super::SessionId;
use crate::net::Connection;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct Session {
    /// The connection the session was last attached on: the server closes it when the session ends
    /// without its client's asking. An ensemble's leader tracks sessions attached anywhere (`None`):
    /// each member closes its own connections.
    pub connection: Option<Connection>,
    pub timeout_ms: i64,
    expires_at_ms: i64,
}

#[derive(Debug, Clone)]
pub struct Sessions {
    tick_ms: i64,
    next_id: SessionId,
    live: BTreeMap<SessionId, Session>,
}

impl Sessions {
    pub fn new(tick_ms: i64) -> Sessions {
        Sessions { tick_ms, next_id: 1, live: BTreeMap::new() }
    }

    fn expiry(&self, now_ms: i64, timeout_ms: i64) -> i64 {
        (now_ms + timeout_ms).div_euclid(self.tick_ms) * self.tick_ms + self.tick_ms
    }

    /// Open a session for the client on `connection`; returns its id and negotiated timeout.
    pub fn open(&mut self, connection: Connection, requested_ms: i64, now_ms: i64) -> (SessionId, i64) {
        let timeout_ms = self.negotiate(requested_ms);
        let id = self.next_id;
        self.next_id += 1;
        self.track(id, timeout_ms, now_ms);
        self.live.get_mut(&id).expect("just tracked").connection = Some(connection);
        (id, timeout_ms)
    }

    /// A requested timeout, negotiated into [2, 20] × tickTime (`processConnectRequest`).
    pub fn negotiate(&self, requested_ms: i64) -> i64 {
        requested_ms.clamp(2 * self.tick_ms, 20 * self.tick_ms)
    }

    /// Track session `id`, of timeout `timeout_ms`, from `now_ms` (`SessionTrackerImpl.trackSession`:
    /// an ensemble's leader tracks each session created anywhere, and a new leader every session its
    /// database holds, each with a full timeout from its start).
    pub fn track(&mut self, id: SessionId, timeout_ms: i64, now_ms: i64) {
        let expires_at_ms = self.expiry(now_ms, timeout_ms);
        self.live.insert(id, Session { connection: None, timeout_ms, expires_at_ms });
    }

    /// Renew a live session (any request or ping); `None` if it has expired or never existed.
    pub fn touch(&mut self, id: SessionId, now_ms: i64) -> Option<&mut Session> {
        let expires_at_ms = self.expiry(now_ms, self.live.get(&id)?.timeout_ms);
        let session = self.live.get_mut(&id)?;
        session.expires_at_ms = expires_at_ms;
        Some(session)
    }

    /// Give every session a full timeout from `now_ms` (a server recovering from its log).
    pub fn renew_all(&mut self, now_ms: i64) {
        let ids: Vec<SessionId> = self.live.keys().copied().collect();
        for id in ids {
            self.touch(id, now_ms);
        }
    }

    pub fn close(&mut self, id: SessionId) -> Option<Session> {
        self.live.remove(&id)
    }

    /// Remove and return every session whose expiry time has come, in id order.
    pub fn expire(&mut self, now_ms: i64) -> Vec<(SessionId, Session)> {
        let due: Vec<SessionId> =
            self.live.iter().filter(|(_, s)| s.expires_at_ms <= now_ms).map(|(id, _)| *id).collect();
        due.into_iter().map(|id| (id, self.live.remove(&id).expect("just listed"))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::NodeIx;

    #[test]
    fn timeouts_are_negotiated_into_two_to_twenty_ticks() {
        let mut s = Sessions::new(2000);
        assert_eq!(s.open(Connection::shared(NodeIx(0)), 1000, 0).1, 4000);
        assert_eq!(s.open(Connection::shared(NodeIx(0)), 10_000, 0).1, 10_000);
        assert_eq!(s.open(Connection::shared(NodeIx(0)), 100_000, 0).1, 40_000);
    }

    #[test]
    fn a_session_expires_at_the_tick_after_its_timeout_unless_renewed() {
        let mut s = Sessions::new(2000);
        let (id, _) = s.open(Connection::shared(NodeIx(0)), 5000, 100);
        // 100 + 5000 = 5100, rounded up to the next tick: 6000.
        assert!(s.expire(5999).is_empty());
        assert!(s.touch(id, 3000).is_some());
        // Renewed at 3000: 8000 rounds up to the next tick, 10000 (ZooKeeper's roundToNextInterval).
        assert!(s.expire(9999).is_empty());
        assert_eq!(s.expire(10_000).len(), 1);
        assert!(s.touch(id, 10_001).is_none());
    }
}
