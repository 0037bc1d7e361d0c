//! One server of a ZooKeeper 3.8 ensemble ([`ZkMember`]): leader election, the leader's proposals,
//! its followers, and sessions kept alive through the leader.
//!
//! Modelled behaviour, from ZooKeeper 3.8's `quorum` package:
//! - *Election* (`FastLeaderElection`): a server that is `LOOKING` bumps its logical clock (`round`),
//!   votes for itself — (epoch, last logged zxid, server id), compared in that order
//!   (`totalOrderPredicate`) — and sends its vote to every peer; it adopts any better vote it hears in
//!   its round and sends it on. Once a quorum of the round's votes agrees with its own it waits
//!   `finalizeWait` (200 ms) for a better one, then leads or follows. Without a decision it sends its
//!   vote again after 200 ms, doubling up to `maxNotificationInterval` (60 s). A server that is leading
//!   or following answers a looking one with its vote; a looking server joins a leader only when a
//!   quorum of those answers names it and the leader itself says it leads (`checkLeader`): a server
//!   cut off from the leader stays looking however many followers it reaches.
//! - *Discovery and sync* (`Leader.lead`, `Learner`): a follower sends `FOLLOWERINFO` (every 100 ms,
//!   `leaderConnectDelayDuringRetryMs`, until the leader listens); the leader waits for a quorum,
//!   picks an epoch above every one they accepted, and sends each a snapshot (`SNAP`: the tree and the
//!   sessions; the follower's own uncommitted proposals are dropped, as `TRUNC` would). It is
//!   established once a quorum acknowledges; either side gives up after `initLimit` ticks. A new
//!   leader first applies every proposal it logged (`loadData` replays the whole log) and tracks every
//!   session of its database with a full timeout (`LeaderZooKeeperServer.createSessionTracker`).
//! - *Writes* go through the leader: a follower forwards the request (`FollowerRequestProcessor`), the
//!   leader gives it the next zxid, logs and proposes it, and commits it — in zxid order — once a
//!   quorum has acknowledged; every server applies it at the commit, and the server the client is on
//!   answers then. Reads and watches are served by the client's own server from its own copy. A
//!   session's requests are answered in order: a read (a ping too) waits behind the session's write
//!   still in flight (`CommitProcessor`). `sync` is answered once the leader's proposals before it are
//!   committed and the answer has come behind their commits.
//! - *Liveness* (`Leader.lead`'s loop, `LearnerHandler`, `Learner`): the leader pings every learner
//!   each half tick; a learner answers with the sessions its clients touched since
//!   (`LearnerSessionTracker`'s touch table), which the leader's tracker renews. Every tick the leader
//!   counts the learners it heard from within `syncLimit` ticks, and gives up leading ("Not sufficient
//!   followers synced") without a quorum. A follower gives up on a leader it has not heard from for
//!   `syncLimit·tickTime` (its socket's read timeout). A server that stops leading or following closes
//!   every client connection (`Learner.shutdown` → `closeAllConnections`) and refuses new ones until
//!   it serves again ("ZooKeeperServer not running").
//! - *Sessions*: only the leader expires them, in tickTime buckets, each by a `closeSession`
//!   transaction; every server that has the session's connection closes it when it applies that
//!   transaction. A client that connects anew gets a session id carrying the server's id
//!   (`SessionTrackerImpl.initializeNextSessionId`); one that re-attaches to another server is
//!   revalidated by the leader (`Learner.validateSession`), which renews it or says it expired.
//! - *Moved sessions* (`SessionTrackerImpl.checkSession`): the leader notes which server each session
//!   is on — the one that created it, then the one that revalidated it; a new leader learns it from
//!   the first write that comes. A write that comes from another server — a request that server read
//!   before its client moved on, sent to the leader late — fails with `SessionMovedException`: the
//!   leader turns it into an error transaction (`ErrorTxn`), which takes a zxid like any other. Its
//!   server, applying it, does not answer: it closes the session's connection (`FinalRequestProcessor`,
//!   ZOOKEEPER-710), so a client that is still there reconnects, and its server's revalidation makes it
//!   the owner again. Closing a session is not checked (the leader's own expiry closes sessions it
//!   does not own).
//! - *Durability*: a server's log outlives its process; a restarted one starts looking with it.
//! - *Clients that have seen more* (`ZooKeeperServer.processConnectRequest`): a client connects with
//!   the last zxid a reply carried to it (`lastZxidSeen`); a server that has applied less closes the
//!   connection unanswered, and the client tries the next server. Every reply carries the answering
//!   server's last applied zxid ([`Stamped`]).
//! - *Apply lag*: a follower takes up its leader's commits, and the answers to syncs that come behind
//!   them, `apply_lag` late (its `CommitProcessor` behind its log; the `lag` fault for a while).
//!
//! Not modelled yet: observers.

use super::replica::Replica;
use super::session::Sessions;
use super::{SessionId, Stamped, ZkError, ZkOp, ZkReply, ZkRequest};
use crate::backend::member::{member_faults, serve_member, Member, MemberOut, RequestId};
use crate::backend::Now;
use crate::history::{EventKind, NodeIx};
use crate::net::Connection;
use crate::world::{MemberFault, Program, World};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

/// The timing of an ensemble (`zoo.cfg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub tick_ms: i64,
    /// Ticks a follower has to connect and sync with a new leader.
    pub init_limit: i64,
    /// Ticks a follower may be out of touch with its leader.
    pub sync_limit: i64,
    /// How late a follower applies each commit (and answers what waited for it).
    pub apply_lag_ms: i64,
}

/// `FastLeaderElection.finalizeWait`: how long a server that sees a quorum for its vote waits for a
/// better one, and its first wait between sending its vote again.
const FINALIZE_WAIT_MS: i64 = 200;
/// `FastLeaderElection.maxNotificationInterval`.
const MAX_NOTIFICATION_INTERVAL_MS: i64 = 60_000;
/// `Learner`'s wait between attempts to reach its leader (`leaderConnectDelayDuringRetryMs`).
const LEADER_CONNECT_DELAY_MS: i64 = 100;

/// A vote: for server `sid`, whose epoch and last zxid these are; ordered as `totalOrderPredicate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Vote {
    epoch: u32,
    zxid: u64,
    sid: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    Looking,
    Following,
    Leading,
}

/// A transaction of the ensemble.
#[derive(Debug, Clone)]
pub enum Txn {
    CreateSession {
        id: SessionId,
        owner: NodeIx,
        timeout_ms: i64,
    },
    /// `expired`: the leader's tracker ended it, not its client.
    CloseSession {
        id: SessionId,
        expired: bool,
    },
    Op {
        session: SessionId,
        op: ZkOp,
    },
    /// A write of `session` the leader refused because the session is on another server now
    /// (`ErrorTxn` with `SESSIONMOVED`): it changes nothing, and its server closes the session's
    /// connection.
    Moved {
        session: SessionId,
    },
}

/// A proposal: its zxid, its transaction, and the server (and its token) whose client waits for it.
#[derive(Debug, Clone)]
pub struct Proposal {
    zxid: u64,
    txn: Txn,
    origin: Option<(usize, u64)>,
}

/// What the servers of an ensemble say to each other; every message after the election carries the
/// epoch it belongs to, and one of another epoch, or from a server that is not the leader or learner
/// it should come from, is ignored (a connection of an earlier epoch).
#[derive(Debug)]
pub enum Peer {
    Notification {
        vote: Vote,
        round: u64,
        state: PeerState,
    },
    /// `attempt`: which of the follower's attempts to follow a leader this is (a new connection to it,
    /// in the real server): the leader answers each attempt once, and the follower takes only the
    /// answer to its current one.
    FollowerInfo {
        accepted: u32,
        attempt: u64,
    },
    NewLeader {
        epoch: u32,
        attempt: u64,
        snapshot: Box<Replica>,
    },
    AckNewLeader {
        epoch: u32,
    },
    Submit {
        epoch: u32,
        token: u64,
        txn: Txn,
    },
    Revalidate {
        epoch: u32,
        token: u64,
        session: SessionId,
    },
    Revalidated {
        epoch: u32,
        token: u64,
        valid: bool,
    },
    Sync {
        epoch: u32,
        token: u64,
    },
    Synced {
        epoch: u32,
        token: u64,
    },
    Propose {
        epoch: u32,
        proposal: Proposal,
    },
    Ack {
        epoch: u32,
        zxid: u64,
    },
    Commit {
        epoch: u32,
        zxid: u64,
    },
    Ping {
        epoch: u32,
    },
    PingReply {
        epoch: u32,
        touched: Vec<SessionId>,
    },
}

type Out = MemberOut<Stamped, Peer>;

#[derive(Debug)]
struct Election {
    vote: Vote,
    /// This round's votes of looking servers (`recvset`), its own among them.
    votes: BTreeMap<usize, Vote>,
    /// Votes of servers leading or following (`outofelection`).
    settled: BTreeMap<usize, (Vote, PeerState)>,
    decide_at: Option<i64>,
    resend_at: i64,
    backoff_ms: i64,
}

#[derive(Debug)]
struct Following {
    leader: usize,
    /// Its attempt to follow (see [`Peer::FollowerInfo`]).
    attempt: u64,
    /// The epoch of the leader's snapshot, once it came: until then the follower does not serve.
    epoch: Option<u32>,
    last_heard_ms: i64,
    /// While syncing: when it sends `FOLLOWERINFO` again, and when it gives up.
    info_at: i64,
    give_up_at: i64,
}

#[derive(Debug)]
struct Learner {
    /// `tickOfNextAckDeadline`.
    deadline_tick: i64,
    /// The attempt it was synced for.
    attempt: u64,
}

#[derive(Debug)]
struct Leading {
    /// The epoch, once a quorum said which they accepted.
    epoch: Option<u32>,
    /// Followers that sent `FOLLOWERINFO` before the epoch was chosen: the epoch they accepted, and
    /// their attempt.
    infos: BTreeMap<usize, (u32, u64)>,
    learners: BTreeMap<usize, Learner>,
    acked_new_leader: BTreeSet<usize>,
    established: bool,
    give_up_at: i64,
    tick: i64,
    next_half_tick_ms: i64,
    half: bool,
    next_expiry_ms: i64,
    tracker: Sessions,
    next_zxid: u64,
    acks: BTreeMap<u64, BTreeSet<usize>>,
    /// Syncs waiting for a zxid's commit: (zxid, learner or itself, token).
    syncs: Vec<(u64, usize, u64)>,
    /// The server each session is on, as far as the leader knows (`SessionImpl.owner`).
    owners: BTreeMap<SessionId, usize>,
}

#[derive(Debug)]
enum Role {
    Looking(Election),
    Following(Following),
    Leading(Box<Leading>),
}

/// A client request waiting its turn in its session's queue; `token`: sent on, and awaited.
#[derive(Debug)]
struct Queued {
    id: RequestId,
    op: ZkOp,
    token: Option<u64>,
}

/// What a server waits for from the leader, by token.
#[derive(Debug)]
enum Waiting {
    Connect { id: RequestId, via: Connection, timeout_ms: i64 },
    Reattach { id: RequestId, via: Connection, session: SessionId, timeout_ms: i64 },
    Op { session: SessionId },
}

/// One server of an ensemble.
#[derive(Debug)]
pub struct ZkMember {
    sid: usize,
    members: Vec<NodeIx>,
    timing: Timing,
    replica: Replica,
    /// Proposals logged and not yet committed, in zxid order.
    log: VecDeque<Proposal>,
    /// The epoch it last accepted (`currentEpoch`).
    epoch: u32,
    round: u64,
    role: Role,
    /// The vote it stands by while leading or following.
    settled_vote: Vote,
    attached: BTreeMap<SessionId, Connection>,
    queues: BTreeMap<SessionId, VecDeque<Queued>>,
    waiting: BTreeMap<u64, Waiting>,
    next_token: u64,
    next_session: u64,
    /// Its attempts to follow so far.
    attempts: u64,
    /// Sessions its clients touched since the leader's last ping (a follower's touch table).
    touched: BTreeSet<SessionId>,
    /// The `lag` fault's apply lag while it lasts, in place of [`Timing::apply_lag_ms`].
    lag_ms: Option<i64>,
    /// What a following server has taken from its leader and not yet taken up, in order, each with
    /// when it does.
    behind: VecDeque<(i64, Behind)>,
}

/// What a follower takes up in its commit order (its `CommitProcessor`): a commit, or the answer to a
/// sync, which comes behind the commits before it.
#[derive(Debug)]
enum Behind {
    Commit(Proposal),
    Synced(u64),
}

impl ZkMember {
    /// Server `sid` (0-based; `myid` is one more) of the ensemble on `members`.
    pub fn new(sid: usize, members: Vec<NodeIx>, timing: Timing) -> ZkMember {
        let vote = Vote { epoch: 0, zxid: 0, sid };
        ZkMember {
            sid,
            members,
            timing,
            replica: Replica::default(),
            log: VecDeque::new(),
            epoch: 0,
            round: 0,
            role: Role::Looking(Election {
                vote,
                votes: BTreeMap::new(),
                settled: BTreeMap::new(),
                decide_at: None,
                resend_at: 0,
                backoff_ms: FINALIZE_WAIT_MS,
            }),
            settled_vote: vote,
            attached: BTreeMap::new(),
            queues: BTreeMap::new(),
            waiting: BTreeMap::new(),
            next_token: 0,
            next_session: 0,
            attempts: 0,
            touched: BTreeSet::new(),
            lag_ms: None,
            behind: VecDeque::new(),
        }
    }

    /// Whether it leads an established ensemble now.
    pub fn leads(&self) -> bool {
        matches!(&self.role, Role::Leading(l) if l.established)
    }

    /// Whether the connection of `client`'s session is on this server.
    pub fn serves(&self, client: NodeIx) -> bool {
        self.attached.iter().any(|(session, c)| c.peer == client && self.replica.owner(*session) == Some(client))
    }

    fn quorum(&self) -> usize {
        self.members.len() / 2 + 1
    }

    fn sid_of(&self, node: NodeIx) -> Option<usize> {
        self.members.iter().position(|m| *m == node)
    }

    fn last_zxid(&self) -> u64 {
        self.log.back().map_or(self.replica.zxid(), |p| p.zxid)
    }

    fn serving(&self) -> bool {
        match &self.role {
            Role::Looking(_) => false,
            Role::Following(f) => f.epoch.is_some(),
            Role::Leading(l) => l.established,
        }
    }

    fn broadcast(&self, msg: impl Fn() -> Peer, out: &mut Out) {
        for (sid, node) in self.members.iter().enumerate() {
            if sid != self.sid {
                out.tell(*node, msg());
            }
        }
    }

    // ---- serving clients ----

    /// Close every client connection and forget what waited on them (`closeAllConnections`): their
    /// watches go with them.
    fn stop_serving(&mut self, out: &mut Out) {
        for (_, connection) in std::mem::take(&mut self.attached) {
            out.out.close(connection);
        }
        self.queues.clear();
        self.waiting.clear();
        self.touched.clear();
        self.replica = self.replica.snapshot();
    }

    fn touch(&mut self, session: SessionId, now_ms: i64) -> bool {
        match &mut self.role {
            Role::Leading(l) => l.tracker.touch(session, now_ms).is_some(),
            _ => {
                self.touched.insert(session);
                self.replica.owner(session).is_some()
            }
        }
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// Send a transaction to the leader (or propose it, leading), under `token`.
    fn submit(&mut self, token: u64, txn: Txn, now_ms: i64, out: &mut Out) {
        match &self.role {
            Role::Leading(_) => self.prepare(txn, self.sid, token, now_ms, out),
            Role::Following(f) => {
                let (leader, epoch) = (f.leader, f.epoch.expect("a serving follower has its epoch"));
                out.tell(self.members[leader], Peer::Submit { epoch, token, txn });
            }
            Role::Looking(_) => unreachable!("a looking server serves nobody"),
        }
    }

    /// Answer request `id`, its header carrying the last zxid this server applied (a write's own, when
    /// it answers at its apply).
    fn answer(&self, id: RequestId, reply: ZkReply, out: &mut Out) {
        out.reply(id, Stamped { zxid: self.replica.zxid(), reply });
    }

    fn attach(&mut self, session: SessionId, via: Connection) {
        self.attached.insert(session, via);
    }

    /// Answer what `session`'s queue can answer now, in order, and send on the first write.
    fn pump(&mut self, session: SessionId, now_ms: i64, out: &mut Out) {
        loop {
            let Some(head) = self.queues.get_mut(&session).and_then(|q| q.front_mut()) else { return };
            if head.token.is_some() {
                return;
            }
            let txn = match &head.op {
                ZkOp::Create { .. } | ZkOp::Delete { .. } | ZkOp::SetData { .. } | ZkOp::Multi(_) => {
                    Some(Txn::Op { session, op: head.op.clone() })
                }
                ZkOp::Close => Some(Txn::CloseSession { id: session, expired: false }),
                ZkOp::Sync { .. } => None,
                _ => {
                    let head = self.queues.get_mut(&session).and_then(|q| q.pop_front()).expect("just seen");
                    let reply = self.replica.op(session, head.op, &mut out.out).unwrap_or_else(ZkReply::Error);
                    self.answer(head.id, reply, out);
                    continue;
                }
            };
            // Awaited before it is sent: a leader with nothing in flight answers a sync at once.
            let token = self.token();
            self.waiting.insert(token, Waiting::Op { session });
            self.queues.get_mut(&session).and_then(|q| q.front_mut()).expect("just seen").token = Some(token);
            match txn {
                Some(txn) => self.submit(token, txn, now_ms, out),
                None => self.sync(token, now_ms, out),
            }
            return;
        }
    }

    fn sync(&mut self, token: u64, now_ms: i64, out: &mut Out) {
        match &mut self.role {
            Role::Leading(l) => match self.log.back() {
                Some(last) => l.syncs.push((last.zxid, self.sid, token)),
                None => self.done(token, None, now_ms, out),
            },
            Role::Following(f) => {
                let msg = Peer::Sync { epoch: f.epoch.expect("serving"), token };
                out.tell(self.members[f.leader], msg);
            }
            Role::Looking(_) => unreachable!("a looking server serves nobody"),
        }
    }

    /// What `token` waited for came: a transaction applied (its reply), a sync or a revalidation.
    fn done(&mut self, token: u64, reply: Option<ZkReply>, now_ms: i64, out: &mut Out) {
        match self.waiting.remove(&token) {
            Some(Waiting::Op { session }) => {
                let Some(head) = self.queues.get_mut(&session).and_then(|q| q.pop_front()) else { return };
                let reply = match (reply, &head.op) {
                    (Some(reply), _) => reply,
                    (None, ZkOp::Sync { path }) => ZkReply::Synced { path: path.clone() },
                    (None, op) => unreachable!("{op:?} waits for its transaction"),
                };
                self.answer(head.id, reply, out);
                self.pump(session, now_ms, out);
            }
            Some(Waiting::Connect { id, via, timeout_ms }) => {
                let Some(ZkReply::Connected { session, .. }) = reply else { unreachable!("a session's creation") };
                self.attach(session, via);
                out.out.lease_started(via.peer, session);
                self.answer(id, ZkReply::Connected { session, timeout_ms }, out);
            }
            Some(Waiting::Reattach { .. }) | None => {}
        }
    }

    fn revalidated(&mut self, token: u64, valid: bool, out: &mut Out) {
        if let Some(Waiting::Reattach { id, via, session, timeout_ms }) = self.waiting.remove(&token) {
            let reply = self.reattach(session, via, valid, timeout_ms);
            self.answer(id, reply, out);
        }
    }

    /// The leader said whether `session` lives: if so it is attached here, with the timeout negotiated
    /// from the client's request (`finishSessionInit`: a follower need not have applied the session's
    /// creation yet).
    fn reattach(&mut self, session: SessionId, via: Connection, valid: bool, timeout_ms: i64) -> ZkReply {
        if !valid {
            return ZkReply::Error(ZkError::SessionExpired);
        }
        self.attach(session, via);
        ZkReply::Connected { session, timeout_ms }
    }

    /// A client re-attaches `session` here: the leader revalidates it (itself, or asked by a follower).
    fn revalidate(
        &mut self,
        session: SessionId,
        via: Connection,
        id: RequestId,
        timeout_ms: i64,
        now_ms: i64,
        out: &mut Out,
    ) {
        match &mut self.role {
            Role::Leading(l) => {
                let valid = l.tracker.touch(session, now_ms).is_some();
                if valid {
                    l.owners.insert(session, self.sid);
                }
                let reply = self.reattach(session, via, valid, timeout_ms);
                self.answer(id, reply, out);
            }
            Role::Following(f) => {
                let (leader, epoch) = (f.leader, f.epoch.expect("serving"));
                let token = self.token();
                self.waiting.insert(token, Waiting::Reattach { id, via, session, timeout_ms });
                out.tell(self.members[leader], Peer::Revalidate { epoch, token, session });
            }
            Role::Looking(_) => unreachable!("serving"),
        }
    }

    /// The timeout a client asking for `requested_ms` gets: 2 to 20 ticks.
    fn negotiate(&self, requested_ms: i64) -> i64 {
        requested_ms.clamp(2 * self.timing.tick_ms, 20 * self.timing.tick_ms)
    }

    // ---- the log ----

    /// Apply a committed proposal to this server's copy, and answer its client if it is here.
    fn apply(&mut self, proposal: Proposal, now_ms: i64, out: &mut Out) {
        let Proposal { zxid, txn, origin } = proposal;
        let mine = origin.filter(|(sid, _)| *sid == self.sid).map(|(_, token)| token);
        let reply = match txn {
            Txn::CreateSession { id, owner, timeout_ms } => {
                self.replica.open_session(id, owner, timeout_ms);
                self.replica.advance_to(zxid);
                if let Role::Leading(l) = &mut self.role {
                    l.tracker.track(id, timeout_ms, now_ms);
                }
                ZkReply::Connected { session: id, timeout_ms }
            }
            Txn::CloseSession { id, expired } => {
                let owner = self.replica.owner(id);
                if let (true, true, Some(owner)) = (expired, matches!(self.role, Role::Leading(_)), owner) {
                    out.out.record(owner, EventKind::Session { state: "expired by the server".into() });
                    out.out.lease_ended(owner, id);
                }
                if let Role::Leading(l) = &mut self.role {
                    l.tracker.close(id);
                }
                let reply = self.replica.apply(zxid, id, None, &mut out.out).unwrap_or_else(ZkReply::Error);
                if let Some(token) = mine {
                    self.done(token, Some(reply.clone()), now_ms, out);
                } else if let Some(connection) = self.attached.get(&id) {
                    out.out.close(*connection);
                }
                self.attached.remove(&id);
                self.queues.remove(&id);
                return;
            }
            Txn::Op { session, op } => {
                self.replica.apply(zxid, session, Some(op), &mut out.out).unwrap_or_else(ZkReply::Error)
            }
            Txn::Moved { session } => {
                self.replica.advance_to(zxid);
                if mine.is_some_and(|token| self.waiting.remove(&token).is_some()) {
                    if let Some(connection) = self.attached.remove(&session) {
                        out.out.close(connection);
                    }
                    self.queues.remove(&session);
                }
                return;
            }
        };
        if let Some(token) = mine {
            self.done(token, Some(reply), now_ms, out);
        }
    }

    /// Following: take up a commit or a sync's answer from the leader — at once, or, with an apply lag,
    /// that much later and after what came before it.
    fn behind(&mut self, item: Behind, now_ms: i64, out: &mut Out) {
        let lag = self.lag_ms.unwrap_or(self.timing.apply_lag_ms);
        if lag == 0 && self.behind.is_empty() {
            return self.take_up(item, now_ms, out);
        }
        let at = self.behind.back().map_or(0, |(at, _)| *at).max(now_ms + lag);
        self.behind.push_back((at, item));
    }

    fn take_up(&mut self, item: Behind, now_ms: i64, out: &mut Out) {
        match item {
            Behind::Commit(proposal) => self.apply(proposal, now_ms, out),
            Behind::Synced(token) => self.done(token, None, now_ms, out),
        }
    }

    /// Take up what is due of what it is behind on (`all`: everything, as it stops following: the
    /// commits are in its log, which a restart or a new role replays).
    fn catch_up(&mut self, now_ms: i64, all: bool, out: &mut Out) {
        while self.behind.front().is_some_and(|(at, _)| all || *at <= now_ms) {
            let (_, item) = self.behind.pop_front().expect("just seen");
            self.take_up(item, now_ms, out);
        }
    }

    /// Lead: check a transaction server `from` sent on for its client (`PrepRequestProcessor`), and
    /// propose it, or the error it fails with.
    fn prepare(&mut self, txn: Txn, from: usize, token: u64, now_ms: i64, out: &mut Out) {
        let Role::Leading(l) = &mut self.role else { unreachable!("only the leader prepares") };
        let txn = match txn {
            Txn::CreateSession { id, .. } => {
                l.owners.insert(id, from);
                txn
            }
            Txn::Op { session, .. } => match *l.owners.entry(session).or_insert(from) {
                owner if owner != from => Txn::Moved { session },
                _ => txn,
            },
            Txn::CloseSession { id, .. } => {
                l.owners.remove(&id);
                txn
            }
            Txn::Moved { .. } => txn,
        };
        self.propose(txn, Some((from, token)), now_ms, out);
    }

    /// Lead: give `txn` the next zxid, log it and propose it to the learners.
    fn propose(&mut self, txn: Txn, origin: Option<(usize, u64)>, now_ms: i64, out: &mut Out) {
        let Role::Leading(l) = &mut self.role else { unreachable!("only the leader proposes") };
        let epoch = l.epoch.expect("an established leader has its epoch");
        l.next_zxid += 1;
        let proposal = Proposal { zxid: l.next_zxid, txn, origin };
        l.acks.insert(proposal.zxid, BTreeSet::from([self.sid]));
        for sid in l.learners.keys() {
            out.tell(self.members[*sid], Peer::Propose { epoch, proposal: proposal.clone() });
        }
        self.log.push_back(proposal);
        self.commit_acked(now_ms, out);
    }

    /// Commit, in zxid order, the proposals a quorum has acknowledged.
    fn commit_acked(&mut self, now_ms: i64, out: &mut Out) {
        let quorum = self.quorum();
        loop {
            let Role::Leading(l) = &mut self.role else { return };
            let Some(first) = self.log.front() else { return };
            if l.acks.get(&first.zxid).is_none_or(|a| a.len() < quorum) {
                return;
            }
            l.acks.remove(&first.zxid);
            let epoch = l.epoch.expect("proposing");
            let zxid = first.zxid;
            for sid in l.learners.keys() {
                out.tell(self.members[*sid], Peer::Commit { epoch, zxid });
            }
            let proposal = self.log.pop_front().expect("just seen");
            self.apply(proposal, now_ms, out);
            let Role::Leading(l) = &mut self.role else { return };
            let (due, left): (Vec<_>, Vec<_>) = l.syncs.drain(..).partition(|(at, _, _)| *at <= zxid);
            l.syncs = left;
            for (_, sid, token) in due {
                if sid == self.sid {
                    self.done(token, None, now_ms, out);
                } else {
                    out.tell(self.members[sid], Peer::Synced { epoch, token });
                }
            }
        }
    }

    // ---- roles ----

    /// Stop serving and look for a leader (`QuorumPeer` back to `LOOKING`).
    fn look(&mut self, now_ms: i64, out: &mut Out) {
        self.stop_serving(out);
        self.catch_up(now_ms, true, out);
        self.round += 1;
        let vote = Vote { epoch: self.epoch, zxid: self.last_zxid(), sid: self.sid };
        self.role = Role::Looking(Election {
            vote,
            votes: BTreeMap::from([(self.sid, vote)]),
            settled: BTreeMap::new(),
            decide_at: None,
            resend_at: now_ms + FINALIZE_WAIT_MS,
            backoff_ms: FINALIZE_WAIT_MS,
        });
        self.send_vote(out);
    }

    fn send_vote(&self, out: &mut Out) {
        let Role::Looking(e) = &self.role else { return };
        let (vote, round) = (e.vote, self.round);
        self.broadcast(|| Peer::Notification { vote, round, state: PeerState::Looking }, out);
    }

    fn notification(&mut self, now_ms: i64, from: usize, vote: Vote, round: u64, state: PeerState, out: &mut Out) {
        let quorum = self.quorum();
        let (own_vote, own_state) = match &self.role {
            Role::Looking(_) => (None, PeerState::Looking),
            Role::Following(_) => (Some(self.settled_vote), PeerState::Following),
            Role::Leading(_) => (Some(self.settled_vote), PeerState::Leading),
        };
        if let Some(own) = own_vote {
            // Settled: tell a looking server whom it follows.
            if state == PeerState::Looking {
                out.tell(self.members[from], Peer::Notification { vote: own, round: self.round, state: own_state });
            }
            return;
        }
        let my_round = self.round;
        let initial = Vote { epoch: self.epoch, zxid: self.last_zxid(), sid: self.sid };
        let Role::Looking(e) = &mut self.role else { unreachable!() };
        if state == PeerState::Looking {
            if round > my_round {
                self.round = round;
                e.votes.clear();
                e.vote = initial.max(vote);
                e.votes.insert(self.sid, e.vote);
                e.decide_at = None;
                self.send_vote(out);
            } else if round < my_round {
                let (vote, round) = (e.vote, my_round);
                out.tell(self.members[from], Peer::Notification { vote, round, state: PeerState::Looking });
                return;
            } else if vote > e.vote {
                e.vote = vote;
                e.votes.insert(self.sid, vote);
                e.decide_at = None;
                self.send_vote(out);
            }
            let Role::Looking(e) = &mut self.role else { unreachable!() };
            e.votes.insert(from, vote);
            let agree = e.votes.values().filter(|v| **v == e.vote).count();
            if agree >= quorum && e.decide_at.is_none() {
                e.decide_at = Some(now_ms + FINALIZE_WAIT_MS);
            }
            return;
        }
        e.settled.insert(from, (vote, state));
        let for_leader = e.settled.values().filter(|(v, _)| v.sid == vote.sid).count();
        let leader_leads = e.settled.get(&vote.sid).is_some_and(|(_, s)| *s == PeerState::Leading);
        if for_leader >= quorum && leader_leads {
            self.round = round;
            self.settle(vote, now_ms, out);
        }
    }

    /// The election is over: lead or follow `vote`'s server.
    fn settle(&mut self, vote: Vote, now_ms: i64, out: &mut Out) {
        self.settled_vote = vote;
        let give_up_at = now_ms + self.timing.init_limit * self.timing.tick_ms;
        if vote.sid == self.sid {
            // `loadData`: the whole log is applied.
            while let Some(proposal) = self.log.pop_front() {
                let proposal = Proposal { origin: None, ..proposal };
                self.apply(proposal, now_ms, out);
            }
            let half = self.timing.tick_ms / 2;
            self.role = Role::Leading(Box::new(Leading {
                epoch: None,
                infos: BTreeMap::new(),
                learners: BTreeMap::new(),
                acked_new_leader: BTreeSet::from([self.sid]),
                established: false,
                give_up_at,
                tick: 0,
                next_half_tick_ms: now_ms + half,
                half: false,
                next_expiry_ms: 0,
                tracker: Sessions::new(self.timing.tick_ms),
                next_zxid: 0,
                acks: BTreeMap::new(),
                syncs: Vec::new(),
                owners: BTreeMap::new(),
            }));
        } else {
            self.attempts += 1;
            self.role = Role::Following(Following {
                leader: vote.sid,
                attempt: self.attempts,
                epoch: None,
                last_heard_ms: now_ms,
                info_at: now_ms,
                give_up_at,
            });
            self.follower_info(now_ms, out);
        }
    }

    fn follower_info(&mut self, now_ms: i64, out: &mut Out) {
        let Role::Following(f) = &mut self.role else { return };
        f.info_at = now_ms + LEADER_CONNECT_DELAY_MS;
        let (leader, attempt) = (f.leader, f.attempt);
        out.tell(self.members[leader], Peer::FollowerInfo { accepted: self.epoch, attempt });
    }

    /// Leading: a follower asked to join; once the epoch is chosen it gets the snapshot.
    fn follower_joins(&mut self, from: usize, accepted: u32, attempt: u64, out: &mut Out) {
        let quorum = self.quorum();
        let Role::Leading(l) = &mut self.role else { return };
        if l.epoch.is_none() {
            l.infos.insert(from, (accepted, attempt));
            if l.infos.len() + 1 < quorum {
                return;
            }
            let epoch = l.infos.values().map(|(e, _)| *e).chain([self.epoch]).max().expect("not empty") + 1;
            l.epoch = Some(epoch);
            l.next_zxid = u64::from(epoch) << 32;
            self.epoch = epoch;
            let joined: Vec<(usize, u64)> =
                std::mem::take(&mut l.infos).into_iter().map(|(s, (_, a))| (s, a)).collect();
            for (sid, attempt) in joined {
                self.sync_learner(sid, attempt, out);
            }
        } else if l.learners.get(&from).is_none_or(|learner| learner.attempt != attempt) {
            // A `FOLLOWERINFO` sent again while the first was on its way is the same attempt.
            self.sync_learner(from, attempt, out);
        }
    }

    fn sync_learner(&mut self, sid: usize, attempt: u64, out: &mut Out) {
        let Role::Leading(l) = &mut self.role else { return };
        let epoch = l.epoch.expect("chosen");
        let deadline_tick = l.tick + self.timing.init_limit.max(self.timing.sync_limit);
        l.learners.insert(sid, Learner { deadline_tick, attempt });
        // The snapshot holds what is committed; what is proposed and not yet committed follows it.
        let snapshot = Box::new(self.replica.snapshot());
        out.tell(self.members[sid], Peer::NewLeader { epoch, attempt, snapshot });
        for proposal in &self.log {
            out.tell(self.members[sid], Peer::Propose { epoch, proposal: proposal.clone() });
        }
    }

    fn established(&mut self, now_ms: i64) {
        let Role::Leading(l) = &mut self.role else { return };
        l.established = true;
        // Every session of the database, tracked with a full timeout from now.
        for (id, timeout_ms) in self.replica.sessions() {
            l.tracker.track(id, timeout_ms, now_ms);
        }
        l.next_expiry_ms = (now_ms.div_euclid(self.timing.tick_ms) + 1) * self.timing.tick_ms;
    }

    fn leader_message(&mut self, from: usize, msg: Peer, now_ms: i64, out: &mut Out) {
        let quorum = self.quorum();
        let Role::Leading(l) = &mut self.role else { return };
        let epoch = l.epoch;
        let known = l.learners.contains_key(&from);
        if let Some(learner) = l.learners.get_mut(&from) {
            learner.deadline_tick = l.tick + self.timing.sync_limit;
        }
        match msg {
            Peer::FollowerInfo { accepted, attempt } => self.follower_joins(from, accepted, attempt, out),
            _ if !known => {}
            Peer::AckNewLeader { epoch: e } if Some(e) == epoch => {
                l.acked_new_leader.insert(from);
                if !l.established && l.acked_new_leader.len() >= quorum {
                    self.established(now_ms);
                    out.out.elected(self.members[self.sid]);
                }
            }
            Peer::Ack { epoch: e, zxid } if Some(e) == epoch => {
                if let Some(acks) = l.acks.get_mut(&zxid) {
                    acks.insert(from);
                }
                self.commit_acked(now_ms, out);
            }
            Peer::Submit { epoch: e, token, txn } if Some(e) == epoch && l.established => {
                self.prepare(txn, from, token, now_ms, out);
            }
            Peer::Revalidate { epoch: e, token, session } if Some(e) == epoch && l.established => {
                let valid = l.tracker.touch(session, now_ms).is_some();
                if valid {
                    l.owners.insert(session, from);
                }
                out.tell(self.members[from], Peer::Revalidated { epoch: e, token, valid });
            }
            Peer::Sync { epoch: e, token } if Some(e) == epoch && l.established => match self.log.back() {
                Some(last) => l.syncs.push((last.zxid, from, token)),
                None => out.tell(self.members[from], Peer::Synced { epoch: e, token }),
            },
            Peer::PingReply { epoch: e, touched } if Some(e) == epoch => {
                for session in touched {
                    l.tracker.touch(session, now_ms);
                }
            }
            _ => {}
        }
    }

    fn follower_message(&mut self, from: usize, msg: Peer, now_ms: i64, out: &mut Out) {
        let Role::Following(f) = &mut self.role else { return };
        if from != f.leader {
            return;
        }
        match msg {
            Peer::NewLeader { epoch, attempt, snapshot } if f.epoch.is_none() && attempt == f.attempt => {
                f.epoch = Some(epoch);
                f.last_heard_ms = now_ms;
                self.epoch = epoch;
                self.log.clear();
                self.replica = *snapshot;
                out.tell(self.members[from], Peer::AckNewLeader { epoch });
                return;
            }
            _ => {}
        }
        let Some(epoch) = f.epoch else { return };
        if message_epoch(&msg) != Some(epoch) {
            return;
        }
        f.last_heard_ms = now_ms;
        match msg {
            Peer::Propose { proposal, .. } => {
                let zxid = proposal.zxid;
                self.log.push_back(proposal);
                out.tell(self.members[from], Peer::Ack { epoch, zxid });
            }
            Peer::Commit { zxid, .. } => {
                while self.log.front().is_some_and(|p| p.zxid <= zxid) {
                    let proposal = self.log.pop_front().expect("just seen");
                    self.behind(Behind::Commit(proposal), now_ms, out);
                }
            }
            Peer::Ping { .. } => {
                let touched = std::mem::take(&mut self.touched).into_iter().collect();
                out.tell(self.members[from], Peer::PingReply { epoch, touched });
            }
            Peer::Revalidated { token, valid, .. } => self.revalidated(token, valid, out),
            Peer::Synced { token, .. } => self.behind(Behind::Synced(token), now_ms, out),
            _ => {}
        }
    }
}

/// The epoch a leader's message belongs to.
fn message_epoch(msg: &Peer) -> Option<u32> {
    match msg {
        Peer::Propose { epoch, .. }
        | Peer::Commit { epoch, .. }
        | Peer::Ping { epoch }
        | Peer::Revalidated { epoch, .. }
        | Peer::Synced { epoch, .. } => Some(*epoch),
        _ => None,
    }
}

impl Member for ZkMember {
    type Request = ZkRequest;
    type Reply = Stamped;
    type Peer = Peer;

    /// The process starts (first, or after a crash): what it held in memory is gone, its log is not;
    /// it starts looking for a leader.
    fn start(&mut self, now: Now, out: &mut Out) {
        self.attached.clear();
        self.look(now.mono_ms, out);
    }

    /// Sessions are timed on the monotonic clock, as on a standalone server.
    fn request(&mut self, now: Now, via: Connection, id: RequestId, request: ZkRequest, out: &mut Out) {
        if !self.serving() {
            // "ZooKeeperServer not running": the connection is closed unanswered.
            out.out.close(via);
            return;
        }
        let now_ms = now.mono_ms;
        match request {
            // The client has seen more than this server has applied: refused, the connection closed
            // ("client must try another server").
            ZkRequest::Connect { last_zxid, .. } if last_zxid > self.replica.zxid() => out.out.close(via),
            ZkRequest::Connect { requested_ms, session: None, .. } => {
                let timeout_ms = self.negotiate(requested_ms);
                self.next_session += 1;
                let session = ((self.sid as u64 + 1) << 56) | self.next_session;
                let txn = Txn::CreateSession { id: session, owner: via.peer, timeout_ms };
                let token = self.token();
                self.waiting.insert(token, Waiting::Connect { id, via, timeout_ms });
                self.submit(token, txn, now_ms, out);
            }
            ZkRequest::Connect { requested_ms, session: Some(session), .. } => {
                let timeout_ms = self.negotiate(requested_ms);
                self.revalidate(session, via, id, timeout_ms, now_ms, out);
            }
            ZkRequest::Op { session, op } => {
                if !self.touch(session, now_ms) {
                    self.answer(id, ZkReply::Error(ZkError::SessionExpired), out);
                    return;
                }
                self.queues.entry(session).or_default().push_back(Queued { id, op, token: None });
                self.pump(session, now_ms, out);
            }
        }
    }

    fn peer(&mut self, now: Now, from: NodeIx, msg: Peer, out: &mut Out) {
        let Some(from) = self.sid_of(from) else { return };
        let now_ms = now.mono_ms;
        match msg {
            Peer::Notification { vote, round, state } => self.notification(now_ms, from, vote, round, state, out),
            msg => match self.role {
                Role::Leading(_) => self.leader_message(from, msg, now_ms, out),
                Role::Following(_) => self.follower_message(from, msg, now_ms, out),
                Role::Looking(_) => {}
            },
        }
    }

    /// `lag`: it applies the commits it takes from now on that late. A leader applies at its commit:
    /// the lag tells once it follows. `stall` is etcd's: ZooKeeper's request pipeline is one.
    fn member_fault(&mut self, fault: MemberFault) -> Result<(), String> {
        match fault {
            MemberFault::Lag(lag) => self.lag_ms = lag.map(|d| d.as_millis() as i64),
            MemberFault::Stall(_) => return Err("a ZooKeeper server's consensus loop cannot stall apart".into()),
        }
        Ok(())
    }

    /// A client's process died: its connections here are gone (its sessions live on until they time
    /// out). A peer's: its leader or learner connection broke (`EOFException`), as at once as a
    /// timeout would later.
    fn closed(&mut self, now: Now, peer: NodeIx, _life: u32, out: &mut Out) {
        match self.sid_of(peer) {
            None => {
                let gone: Vec<SessionId> =
                    self.attached.iter().filter(|(_, c)| c.peer == peer).map(|(s, _)| *s).collect();
                for session in gone {
                    self.attached.remove(&session);
                    self.queues.remove(&session);
                }
            }
            Some(sid) => match &mut self.role {
                Role::Following(f) if f.leader == sid => self.look(now.mono_ms, out),
                Role::Leading(l) => {
                    l.learners.remove(&sid);
                }
                _ => {}
            },
        }
    }

    fn wake(&mut self, now: Now, out: &mut Out) {
        let now_ms = now.mono_ms;
        self.catch_up(now_ms, false, out);
        let quorum = self.quorum();
        let timing = self.timing;
        match &mut self.role {
            Role::Looking(e) => {
                if let Some(at) = e.decide_at.filter(|at| *at <= now_ms) {
                    let _ = at;
                    let vote = e.vote;
                    self.settle(vote, now_ms, out);
                } else if e.resend_at <= now_ms {
                    e.backoff_ms = (e.backoff_ms * 2).min(MAX_NOTIFICATION_INTERVAL_MS);
                    e.resend_at = now_ms + e.backoff_ms;
                    self.send_vote(out);
                }
            }
            Role::Following(f) => {
                let give_up = match f.epoch {
                    Some(_) => f.last_heard_ms + timing.sync_limit * timing.tick_ms <= now_ms,
                    None => f.give_up_at <= now_ms,
                };
                if give_up {
                    self.look(now_ms, out);
                } else if f.epoch.is_none() && f.info_at <= now_ms {
                    self.follower_info(now_ms, out);
                }
            }
            Role::Leading(l) => {
                if !l.established && l.give_up_at <= now_ms {
                    return self.look(now_ms, out);
                }
                if l.next_half_tick_ms <= now_ms {
                    l.next_half_tick_ms += timing.tick_ms / 2;
                    if l.half {
                        l.tick += 1;
                        let tick = l.tick;
                        l.learners.retain(|_, learner| learner.deadline_tick >= tick);
                        if l.established && l.learners.len() + 1 < quorum {
                            // "Not sufficient followers synced".
                            return self.look(now_ms, out);
                        }
                    }
                    l.half = !l.half;
                    if let Some(epoch) = l.epoch {
                        for sid in l.learners.keys() {
                            out.tell(self.members[*sid], Peer::Ping { epoch });
                        }
                    }
                }
                if l.established && l.next_expiry_ms <= now_ms {
                    l.next_expiry_ms += timing.tick_ms;
                    let expired: Vec<SessionId> = l.tracker.expire(now_ms).into_iter().map(|(id, _)| id).collect();
                    for id in expired {
                        self.propose(Txn::CloseSession { id, expired: true }, None, now_ms, out);
                    }
                }
            }
        }
    }

    fn next_wake_ms(&self) -> Option<i64> {
        Some(match &self.role {
            Role::Looking(e) => e.decide_at.map_or(e.resend_at, |d| d.min(e.resend_at)),
            Role::Following(f) => match f.epoch {
                Some(_) => f.last_heard_ms + self.timing.sync_limit * self.timing.tick_ms,
                None => f.info_at.min(f.give_up_at),
            }
            .min(self.behind.front().map_or(i64::MAX, |(at, _)| *at)),
            Role::Leading(l) => {
                let mut at = l.next_half_tick_ms;
                if l.established {
                    at = at.min(l.next_expiry_ms);
                } else {
                    at = at.min(l.give_up_at);
                }
                at
            }
        })
    }
}

/// Start an ensemble of `n` servers named `zk-0`, `zk-1` … in `world`: their nodes, and their states
/// (which outlive a crash: each server's log is on its disk); `world` gives them its member faults.
pub fn deploy(world: &mut World, n: usize, timing: Timing) -> (Vec<NodeIx>, Vec<Arc<Mutex<ZkMember>>>) {
    let first = world.next_index().0;
    let members: Vec<NodeIx> = (0..n as u32).map(|i| NodeIx(first + i)).collect();
    let states: Vec<Arc<Mutex<ZkMember>>> =
        (0..n).map(|sid| Arc::new(Mutex::new(ZkMember::new(sid, members.clone(), timing)))).collect();
    for (sid, state) in states.iter().enumerate() {
        let state = state.clone();
        let program: Program = Arc::new(move |env| {
            let state = state.clone();
            Box::pin(async move {
                let rpc = env.rpc();
                serve_member(state, &rpc, &env.clock, &env.recorder).await
            })
        });
        let node = world.add_server(&format!("zk-{sid}"), program);
        assert_eq!(node, members[sid], "an ensemble's servers are added one after the other");
    }
    world.set_member_faults(member_faults(members.clone(), states.clone()));
    (members, states)
}

#[cfg(test)]
mod tests;
