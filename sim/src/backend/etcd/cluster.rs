//! One member of an etcd 3.5 cluster ([`EtcdMember`]): Raft (elections, the leader's log, commits), the
//! requests each member answers from its own copy of the store, and leases kept on the leader.
//!
//! Modelled behaviour, from etcd 3.5's `raft` package and `etcdserver`, with etcd's defaults
//! (`--heartbeat-interval` 100 ms, `--election-timeout` 1000 ms, `--pre-vote`, `CheckQuorum`):
//! - *Ticks* (`raft.tickElection`, `tickHeartbeat`): Raft's clock is a tick every heartbeat interval,
//!   from the process's start. A follower that hears no leader for its randomized election timeout —
//!   drawn anew in [10, 20) ticks each time it becomes a follower or candidate — campaigns.
//! - *Pre-vote, then vote* (`campaign`, `Step`): a campaigner first asks for pre-votes at its term + 1
//!   without raising its term; only with a quorum of them does it raise its term and ask for votes. A
//!   member grants a (pre-)vote to a log at least as up to date as its own (last term, then last
//!   index), and a vote once per term. A member that heard from its leader within the election timeout
//!   ignores both (`CheckQuorum`'s leader lease): a member that was cut off cannot depose a live
//!   leader when it comes back.
//! - *Log and commits* (`bcastAppend`, `maybeCommit`): a new leader appends an empty entry of its
//!   term; each proposal is appended and sent to every follower with the entries before it they lack;
//!   a follower takes entries that follow on from its log (dropping a conflicting tail), else rejects
//!   and the leader backs off. An entry is committed once a quorum has it and it is of the leader's
//!   term, and the leader tells the followers at once; every member applies committed entries in order, and the member a client asked answers it
//!   once it has applied it. A follower forwards its clients' proposals to the leader (`MsgProp`);
//!   a member that knows no leader drops a proposal (`ErrProposalDropped`): its own client is told at
//!   once, a forwarded one's client hears nothing and times out. Reads and lessor requests wait for a
//!   leader instead (`linearizableReadLoop` asks again, `LeaseRenew` waits), until their deadline.
//! - *Heartbeats and `CheckQuorum`*: the leader sends every follower its log position each tick; every
//!   election timeout it steps down unless a quorum was heard from since the last check.
//! - *Reads* (`ReadIndex`, the default for `Range`): the leader notes its commit index and confirms it
//!   still leads by a heartbeat round a quorum acknowledges; the asking member then answers once it has
//!   applied that index. A leader that has not yet committed an entry of its term holds reads back.
//! - *Leases* (`lessor`): granted and revoked through the log, so every member has them, but only the
//!   leader's lessor is primary. Keep-alives and time-to-live lookups are forwarded to the leader
//!   (`LeaseRenew`'s `forwardToLeader`), which renews in memory, not through the log. When a new leader
//!   has applied its first entry it promotes its lessor: every lease gets its TTL plus the election
//!   timeout from then (`lessor.Promote`). The primary lessor looks for expired leases every 500 ms
//!   and revokes each through the log; a member that stops leading demotes its lessor and revokes
//!   nothing.
//! - *Watches* are a member's own: its watchers hear of a change when it applies it. A member cut off
//!   from its leader applies nothing, so its watchers hear nothing until the heal (`concurrency` asks
//!   for no `WithRequireLeader`).
//! - *A stalled loop* (the `stall` fault: a disk that blocks the log's writes): peers' messages and
//!   the requests that need Raft wait, and its ticks are lost; watches and, on a leader, the lessor go on
//!   answering. Up to 3.5.12 a stalled leader renews a keep-alive from its own lessor, still primary
//!   while the loop has not applied its step-down (etcd#15247); 3.5.13 confirms its leadership by a
//!   `ReadIndex` round first (`ensureLeadership`), which a stalled leader cannot ([`Version`]).
//! - *Durability*: the term, the vote, the log and the applied store outlive a crash (the WAL and the
//!   backend); a restarted member starts as a follower, its watches gone.
//! - *Peer streams* (`rafthttp`): members talk over TCP streams whose reader closes a connection that
//!   carried nothing for `ConnReadTimeout` (5 s) and dials again. What a cut of a member held for that
//!   long is lost, not delivered at the heal: Raft's messages are resent (each append carries all the
//!   follower lacks), but a forwarded proposal, read index or keep-alive is gone, and its client times
//!   out — a delete proposed on a cut-off member does not land seconds after the heal.
//!
//! Not modelled: learners, snapshots and log compaction (a lagging follower gets every entry it
//! lacks), leadership transfer, lease checkpoints (off by default).

use super::{EtcdReply, EtcdRequest, EtcdState, LeaseId, Op};
use crate::backend::member::{member_faults, serve_member, Member, MemberOut, RequestId, Source};
use crate::backend::{Now, Out};
use crate::hazard::Hazard;
use crate::history::NodeIx;
use crate::net::Connection;
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use crate::world::{MemberFault, Program, World};
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `--heartbeat-interval`: one Raft tick.
pub const TICK_MS: i64 = 100;
/// `--election-timeout`, in ticks.
const ELECTION_TICKS: u32 = 10;
/// The lessor's look for expired leases (`lessor.runLoop`).
const LESSOR_LOOK_MS: i64 = 500;
/// `readIndexRetryTime`: a member's read loop asks its leader again for the read index it waits for,
/// with the same request id.
const READ_RETRY_MS: i64 = 500;
/// `ReqTimeout` (5 s plus two election timeouts): the read loop gives a read index up.
const REQ_TIMEOUT_MS: i64 = 5_000 + 2 * ELECTION_TICKS as i64 * TICK_MS;
/// rafthttp's `ConnReadTimeout`: a peer stream that carried nothing for this long is closed, and what
/// a longer cut held on it is lost ([`crate::net::Net::set_read_timeout`]).
const PEER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What a member says (a single server says an [`Out`]; a member also answers later and talks to peers).
type MOut = MemberOut<EtcdReply, EtcdPeer>;

/// A client request as the log carries it: which member (in which life) answers it, by which id, and
/// for which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    member: usize,
    life: u32,
    id: RequestId,
    client: NodeIx,
}

/// What an entry of the log does when applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    /// A new leader's first entry.
    Empty,
    Client {
        origin: Origin,
        request: EtcdRequest,
    },
    /// The primary lessor revokes an expired lease.
    Expire(LeaseId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    term: u64,
    cmd: Cmd,
}

/// What members say to each other.
#[derive(Debug, Clone)]
pub enum EtcdPeer {
    PreVote {
        term: u64,
        last_index: usize,
        last_term: u64,
    },
    PreVoteAnswer {
        term: u64,
        granted: bool,
    },
    Vote {
        term: u64,
        last_index: usize,
        last_term: u64,
    },
    VoteAnswer {
        term: u64,
        granted: bool,
    },
    Append(Append),
    /// `matched`: the follower's log agrees up to here (on a rejection, where the leader should retry).
    AppendAnswer {
        term: u64,
        ok: bool,
        matched: usize,
        read: u64,
    },
    /// A client's write, forwarded to the leader.
    Propose {
        origin: Origin,
        request: EtcdRequest,
    },
    /// Member `asker`'s read loop asks the leader for a read index, by its request id.
    ReadIndex {
        asker: usize,
        id: u64,
    },
    ReadIndexAnswer {
        id: u64,
        index: usize,
    },
    /// A keep-alive or a time-to-live lookup, forwarded to the leader's lessor.
    Lessor {
        origin: Origin,
        request: EtcdRequest,
    },
    LessorAnswer {
        origin: Origin,
        reply: EtcdReply,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// A read index the leader is confirming (raft's `readOnly`): the index it gives, acknowledged by whom,
/// and which member's read loop asked, by which request id (the context its heartbeats carry).
#[derive(Debug)]
struct PendingRead {
    index: usize,
    acks: BTreeSet<usize>,
    asker: usize,
    id: u64,
}

/// A read index this member's read loop waits for (`linearizableReadLoop`, `requestCurrentIndex`): the
/// request ids it was asked under (the newest last; an answer to any of them will do), since when,
/// when it asks again, and what it is for.
#[derive(Debug)]
struct Asking {
    ids: Vec<u64>,
    since_ms: i64,
    retry_ms: i64,
    then: Then,
}

/// A client's linearizable read, and the cluster's highest commit index when this member took it:
/// serving it from a store older than that is a stale read.
#[derive(Debug)]
struct Read {
    origin: Origin,
    request: EtcdRequest,
    floor: usize,
}

/// What a read index is for.
#[derive(Debug)]
enum Then {
    /// A client's linearizable read, served once this member has applied the index.
    Read(Read),
    /// On the leader, a keep-alive its lessor answers once it has confirmed it leads
    /// (`ensureLeadership`, 3.5.13 and later).
    Renew(Origin, EtcdRequest),
}

/// One etcd member.
pub struct EtcdMember {
    me: usize,
    members: Vec<NodeIx>,
    /// The applied store and leases.
    state: EtcdState,
    // Raft's durable state (`HardState`) and log.
    term: u64,
    voted_for: Option<usize>,
    /// Entry `i` is `log[i - 1]`.
    log: Vec<Entry>,
    commit: usize,
    applied: usize,
    // What a life keeps in memory.
    life: u32,
    /// The member's monotonic clock at the input being handled.
    now_ms: i64,
    rng: Option<ChaCha8Rng>,
    role: Role,
    leader: Option<usize>,
    /// Ticks since the leader was heard from (follower) or since the last quorum check (leader).
    election_elapsed: u32,
    randomized_timeout: u32,
    votes: BTreeSet<usize>,
    next_index: Vec<usize>,
    match_index: Vec<usize>,
    /// Members the leader heard from since its last quorum check.
    recent_active: BTreeSet<usize>,
    next_tick_ms: i64,
    next_look_ms: i64,
    /// The lessor is primary: this member leads and has applied its term's first entry.
    primary: bool,
    /// Leases whose revoke the primary lessor has proposed.
    revoking: BTreeSet<LeaseId>,
    /// Lessor requests waiting for a leader to be known, or for the leader's promotion.
    waiting: Vec<(Origin, EtcdRequest)>,
    /// Keep-alives of leases this primary lessor finds expired and has not revoked yet: `lessor.Renew`
    /// waits for the revoke (then the lease is not found) or for a demotion (then `LeaseRenew` takes
    /// `ErrNotPrimary` and forwards the keep-alive to the next leader).
    renewing: Vec<(LeaseId, Origin, EtcdRequest)>,
    /// The leader's read indexes being confirmed, in the order they came.
    reads: Vec<PendingRead>,
    /// Read indexes asked of the leader before it committed an entry of its term (raft's
    /// `pendingReadIndexMessages`): by whom, by which id.
    held_reads: Vec<(usize, u64)>,
    /// Read indexes this member's read loop waits for.
    asking: Vec<Asking>,
    next_id: u64,
    /// Reads waiting for this member to apply their index.
    applying: Vec<(usize, Read)>,
    /// The highest commit index any leader of the cluster has reached, shared by its members: the
    /// world's record for the `stale-read` hazard, which no member reads to decide anything.
    cluster_commit: Arc<AtomicUsize>,
    version: Version,
    /// The consensus loop is stalled (the `stall` fault): peers' messages and the requests that need the
    /// loop wait in `held`, and Raft's ticks are lost.
    stalled: bool,
    held: Vec<Held>,
    /// How late it applies what is committed (the `lag` fault; 0: at once).
    lag_ms: i64,
    /// Commit indexes it learned and has not applied yet, each with when it applies it, in order.
    behind: VecDeque<(i64, usize)>,
}

/// An input a stalled member takes up once its loop runs again, in the order it came.
enum Held {
    Peer(NodeIx, EtcdPeer),
    Request(Origin, EtcdRequest),
}

impl EtcdMember {
    fn new(me: usize, members: Vec<NodeIx>, version: Version) -> EtcdMember {
        let n = members.len();
        EtcdMember {
            me,
            members,
            state: EtcdState::default(),
            term: 0,
            voted_for: None,
            log: Vec::new(),
            commit: 0,
            applied: 0,
            life: 0,
            now_ms: 0,
            rng: None,
            role: Role::Follower,
            leader: None,
            election_elapsed: 0,
            randomized_timeout: ELECTION_TICKS,
            votes: BTreeSet::new(),
            next_index: vec![1; n],
            match_index: vec![0; n],
            recent_active: BTreeSet::new(),
            next_tick_ms: 0,
            next_look_ms: 0,
            primary: false,
            revoking: BTreeSet::new(),
            waiting: Vec::new(),
            renewing: Vec::new(),
            reads: Vec::new(),
            held_reads: Vec::new(),
            asking: Vec::new(),
            next_id: 0,
            applying: Vec::new(),
            cluster_commit: Arc::default(),
            version,
            stalled: false,
            held: Vec::new(),
            lag_ms: 0,
            behind: VecDeque::new(),
        }
    }

    /// Whether this member leads (in the highest term it knows).
    pub fn leads(&self) -> bool {
        self.role == Role::Leader
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    fn quorum(&self) -> usize {
        self.members.len() / 2 + 1
    }

    fn last_index(&self) -> usize {
        self.log.len()
    }

    fn term_at(&self, index: usize) -> u64 {
        if index == 0 {
            0
        } else {
            self.log[index - 1].term
        }
    }

    fn peers(&self) -> impl Iterator<Item = usize> + 'static {
        let me = self.me;
        (0..self.members.len()).filter(move |&p| p != me)
    }

    fn tell(&self, out: &mut MOut, to: usize, msg: EtcdPeer) {
        out.tell(self.members[to], msg);
    }

    fn reset_timeout(&mut self) {
        self.election_elapsed = 0;
        let rng = self.rng.as_mut().expect("a member's generator is set when it starts");
        self.randomized_timeout = rng.gen_range(ELECTION_TICKS..2 * ELECTION_TICKS);
    }

    fn become_follower(&mut self, term: u64, leader: Option<usize>, out: &mut MOut) {
        if term > self.term {
            self.term = term;
            self.voted_for = None;
        }
        let was_leading = self.role == Role::Leader;
        let new_leader = leader.is_some() && leader != self.leader;
        self.role = Role::Follower;
        self.leader = leader;
        self.reset_timeout();
        if was_leading {
            // `lessor.Demote`; read indexes and forwarded requests in flight are dropped (raft's
            // `reset` makes a new `readOnly`).
            self.primary = false;
            self.revoking.clear();
            self.reads.clear();
            self.held_reads.clear();
            let renewing = std::mem::take(&mut self.renewing);
            self.waiting.extend(renewing.into_iter().map(|(_, origin, request)| (origin, request)));
        }
        if new_leader {
            self.leader_changed(out);
        }
        if leader.is_some() {
            self.forward_waiting(out);
        }
    }

    fn campaign(&mut self, pre: bool, out: &mut MOut) {
        self.votes = BTreeSet::from([self.me]);
        self.leader = None;
        self.reset_timeout();
        let (last_index, last_term) = (self.last_index(), self.term_at(self.last_index()));
        if pre {
            self.role = Role::PreCandidate;
            let term = self.term + 1;
            for p in self.peers() {
                self.tell(out, p, EtcdPeer::PreVote { term, last_index, last_term });
            }
        } else {
            self.role = Role::Candidate;
            self.term += 1;
            self.voted_for = Some(self.me);
            let term = self.term;
            for p in self.peers() {
                self.tell(out, p, EtcdPeer::Vote { term, last_index, last_term });
            }
        }
        if self.votes.len() >= self.quorum() {
            self.won(pre, out);
        }
    }

    fn won(&mut self, pre: bool, out: &mut MOut) {
        if pre {
            self.campaign(false, out);
            return;
        }
        self.role = Role::Leader;
        self.leader = Some(self.me);
        out.out.elected(self.members[self.me]);
        self.election_elapsed = 0;
        self.recent_active = BTreeSet::from([self.me]);
        self.next_index = vec![self.last_index() + 1; self.members.len()];
        self.match_index = vec![0; self.members.len()];
        self.append(Cmd::Empty, out);
        self.leader_changed(out);
        self.forward_waiting(out);
    }

    /// The leader appends `cmd` and sends it on.
    fn append(&mut self, cmd: Cmd, out: &mut MOut) {
        self.log.push(Entry { term: self.term, cmd });
        self.match_index[self.me] = self.last_index();
        for p in self.peers() {
            self.send_append(p, 0, out);
        }
        self.maybe_commit(out);
    }

    fn send_append(&self, to: usize, read: u64, out: &mut MOut) {
        let prev_index = self.next_index[to] - 1;
        let msg = EtcdPeer::Append(Append {
            term: self.term,
            prev_index,
            prev_term: self.term_at(prev_index),
            entries: self.log[prev_index..].to_vec(),
            commit: self.commit,
            read,
        });
        self.tell(out, to, msg);
    }

    fn maybe_commit(&mut self, out: &mut MOut) {
        let mut matched = self.match_index.clone();
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let index = matched[self.quorum() - 1];
        if index > self.commit && self.term_at(index) == self.term {
            self.commit = index;
            self.cluster_commit.fetch_max(index, Ordering::Relaxed);
            // The followers hear of the commit at once, not at the next heartbeat (`stepLeader`:
            // `if r.maybeCommit() { r.bcastAppend() }`).
            for p in self.peers() {
                self.send_append(p, 0, out);
            }
        }
        self.apply_committed(out);
    }

    /// How far it applies now: its commit index, or — lagging — the commits whose time has come (a
    /// commit it learns is applied `lag_ms` later, and after the ones before it).
    fn apply_to(&mut self) -> usize {
        let noted = self.behind.back().map_or(self.applied, |(_, index)| *index);
        if self.commit > noted {
            if self.lag_ms == 0 && self.behind.is_empty() {
                return self.commit;
            }
            let due = self.behind.back().map_or(0, |(at, _)| *at).max(self.now_ms + self.lag_ms);
            self.behind.push_back((due, self.commit));
        }
        let mut to = self.applied;
        while let Some((_, index)) = self.behind.front().filter(|(at, _)| *at <= self.now_ms) {
            to = *index;
            self.behind.pop_front();
        }
        to
    }

    /// Apply what is committed and not applied yet (and, lagging, due), in order; answer the reads that
    /// waited for it.
    fn apply_committed(&mut self, out: &mut MOut) {
        let to = self.apply_to();
        // A lease granted here gets its expiry by this member's clock; only a primary lessor acts on
        // it, and a promotion renews every lease.
        while self.applied < to {
            self.applied += 1;
            let entry = self.log[self.applied - 1].clone();
            match entry.cmd {
                Cmd::Empty => {
                    if self.role == Role::Leader && entry.term == self.term && !self.primary {
                        // `lessor.Promote(electionTimeout)`.
                        self.primary = true;
                        let now = self.now_ms;
                        self.state.leases.renew_all(now + i64::from(ELECTION_TICKS) * TICK_MS);
                        self.forward_waiting(out);
                        for (asker, id) in std::mem::take(&mut self.held_reads) {
                            self.read_index(asker, id, out);
                        }
                    }
                }
                Cmd::Expire(lease) => {
                    let mut scratch = Out::default();
                    self.state.revoke(lease, &mut scratch);
                    keep_watch_events(scratch, &mut out.out);
                    let (revoked, others) = std::mem::take(&mut self.renewing).into_iter().partition(|r| r.0 == lease);
                    self.renewing = others;
                    for (_, origin, request) in revoked {
                        self.answer_from_lessor(origin, request, out);
                    }
                }
                Cmd::Client { origin, request } => {
                    let mine = origin.member == self.me && origin.life == self.life;
                    let mut scratch = Out::default();
                    let now = self.now_ms;
                    let reply = self.state.request(now, origin.client, request, &mut scratch);
                    let reply = reply.unwrap_or_else(EtcdReply::Error);
                    if mine {
                        out.out.leases.append(&mut scratch.leases);
                        out.reply(origin.id, reply);
                    }
                    keep_watch_events(scratch, &mut out.out);
                }
            }
        }
        let applied = self.applied;
        let (ready, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.applying).into_iter().partition(|r| r.0 <= applied);
        self.applying = later;
        for (_, read) in ready {
            self.serve_read(read, out);
        }
    }
}

/// Of what a member's copy of the store said while applying an entry some other member answers,
/// keep what is its own: its watchers' notifications. The lease marks are the answering member's.
fn keep_watch_events(scratch: Out, out: &mut Out) {
    let Out { events, pushes, .. } = scratch;
    out.events.extend(events);
    out.pushes.extend(pushes);
}

/// Whether a request is served by the leader's lessor rather than through the log.
fn for_the_lessor(request: &EtcdRequest) -> bool {
    matches!(request, EtcdRequest::LeaseKeepAlive { .. } | EtcdRequest::LeaseTimeToLive { .. })
}

impl EtcdMember {
    /// Take a client's request where it goes: a read index for a read, else the leader's log or its
    /// lessor — or wait for a leader.
    fn route(&mut self, origin: Origin, request: EtcdRequest, out: &mut MOut) {
        if matches!(request, EtcdRequest::Op(Op::Range(_))) {
            let floor = self.cluster_commit.load(Ordering::Relaxed);
            self.ask(Then::Read(Read { origin, request, floor }), out);
            return;
        }
        let lessor = for_the_lessor(&request);
        let Some(leader) = self.leader else {
            if lessor {
                // `LeaseRenew` waits for a leader (`waitLeader`), until the request's deadline.
                self.waiting.push((origin, request));
            } else if origin.member == self.me {
                // Raft drops a proposal with no leader to take it (`stepFollower`, `stepCandidate`),
                // and the server answers with the error.
                out.reply(origin.id, EtcdReply::Error(super::EtcdError::ProposalDropped));
            }
            // A proposal forwarded to a member that has lost its leader since is dropped unanswered:
            // its client's call times out.
            return;
        };
        if leader != self.me {
            let msg = if lessor { EtcdPeer::Lessor { origin, request } } else { EtcdPeer::Propose { origin, request } };
            self.tell(out, leader, msg);
        } else if lessor && !self.primary {
            // The lessor answers once the leader has applied its term's first entry (its promotion).
            self.waiting.push((origin, request));
        } else if lessor && self.confirms_before_renewing(&request) {
            self.ask(Then::Renew(origin, request), out);
        } else if lessor {
            self.answer_from_lessor(origin, request, out);
        } else {
            self.append(Cmd::Client { origin, request }, out);
        }
    }

    fn forward_waiting(&mut self, out: &mut MOut) {
        for (origin, request) in std::mem::take(&mut self.waiting) {
            self.route(origin, request, out);
        }
    }

    /// A request id unique to this member and life (`reqIDGen`).
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        ((self.me as u64 + 1) << 48) | (u64::from(self.life) << 32) | self.next_id
    }

    /// The read loop asks for a read index under a new request id, and will ask again every
    /// [`READ_RETRY_MS`] until an index comes ([`EtcdMember::ask_again`]).
    fn ask(&mut self, then: Then, out: &mut MOut) {
        let id = self.new_id();
        let now = self.now_ms;
        self.asking.push(Asking { ids: vec![id], since_ms: now, retry_ms: now + READ_RETRY_MS, then });
        self.send_read_index(id, out);
    }

    /// `MsgReadIndex` to the leader, or to this member's own Raft if it leads; with no leader known,
    /// Raft drops it ("no leader at term; dropping index reading msg") and the read loop asks again.
    fn send_read_index(&mut self, id: u64, out: &mut MOut) {
        match self.leader {
            Some(leader) if leader == self.me => self.read_index(self.me, id, out),
            Some(leader) => self.tell(out, leader, EtcdPeer::ReadIndex { asker: self.me, id }),
            None => {}
        }
    }

    /// A leader change ends the read loop's round (`ErrLeaderChanged`), and clientv3 asks again at
    /// once (a `Range` is retried on `Unavailable`): every read index waited for is asked of the new
    /// leader under a new request id.
    fn leader_changed(&mut self, out: &mut MOut) {
        let asking = std::mem::take(&mut self.asking);
        for Asking { since_ms, then, .. } in asking {
            self.ask(then, out);
            self.asking.last_mut().expect("just asked").since_ms = since_ms;
        }
    }

    /// The read loop asks again for the read indexes it still waits for, and gives up those it has
    /// waited [`REQ_TIMEOUT_MS`] for (their clients have given up by then). Up to 3.5.27 it asks
    /// again under the same request id; from 3.5.28 under a new one, and takes an answer to any of
    /// them ("Don't reuse same ReadIndex", the fix of etcd#20418).
    fn ask_again(&mut self, out: &mut MOut) {
        let now = self.now_ms;
        self.asking.retain(|a| now - a.since_ms < REQ_TIMEOUT_MS);
        let new_ids = self.version.fixes_20418();
        let mut due = Vec::new();
        for k in 0..self.asking.len() {
            if self.asking[k].retry_ms <= now {
                let id = if new_ids { self.new_id() } else { *self.asking[k].ids.last().expect("asked once") };
                let a = &mut self.asking[k];
                a.retry_ms = now + READ_RETRY_MS;
                if new_ids {
                    a.ids.push(id);
                }
                due.push(id);
            }
        }
        for id in due {
            self.send_read_index(id, out);
        }
    }

    /// The leader takes a read index request (`sendMsgReadIndexResponse`, `ReadOnlySafe`): it notes its
    /// commit index and confirms it still leads by a heartbeat round. A follower passes the request on
    /// to its leader.
    ///
    /// etcd 3.5's raft (`readOnly`) keys a read by its request id: the heartbeats carry the id, a
    /// request whose id is already pending is dropped, and an acknowledgement releases the read with
    /// its id and every read queued before it. Up to 3.5.27 a read loop asks again under the same id:
    /// a retry of a read released meanwhile is queued anew at the commit index of the moment, and an
    /// acknowledgement of the old round still on its way releases it and the reads before it without
    /// a new round — on a leader that was paused while the others elected another, at an index the
    /// cluster has long passed: a stale linearizable read (etcd#20418). From 3.5.28 (and 3.4.42,
    /// 3.6.9) each retry has a new id ([`EtcdMember::ask_again`]), so an old acknowledgement finds
    /// nothing pending under its id. (etcd-io/raft#397 later gave raft's reads positions of their own
    /// instead; no 3.5 release has it.)
    fn read_index(&mut self, asker: usize, id: u64, out: &mut MOut) {
        match self.leader {
            Some(leader) if leader == self.me => {}
            Some(leader) if asker != self.me => return self.tell(out, leader, EtcdPeer::ReadIndex { asker, id }),
            _ => return,
        }
        if !self.primary {
            // Held until the leader has committed an entry of its term.
            self.held_reads.push((asker, id));
            return;
        }
        if self.reads.iter().any(|r| r.id == id) {
            return;
        }
        self.reads.push(PendingRead { index: self.commit, acks: BTreeSet::new(), asker, id });
        for p in self.peers() {
            self.send_append(p, id, out);
        }
        out.out.read_index(self.members[self.me]);
        self.acknowledged(self.me, id, out);
    }

    /// Member `from` acknowledged a heartbeat carrying request id `ctx` (`readOnly.recvAck`): once a
    /// quorum has, release the read with that id and every read queued before it (`advance`), to
    /// their askers.
    fn acknowledged(&mut self, from: usize, ctx: u64, out: &mut MOut) {
        let Some(k) = self.reads.iter().position(|r| r.id == ctx) else { return };
        self.reads[k].acks.insert(from);
        let confirmed = if self.reads[k].acks.len() >= self.quorum() { k + 1 } else { 0 };
        for PendingRead { index, asker, id, .. } in self.reads.drain(..confirmed).collect::<Vec<_>>() {
            if asker == self.me {
                self.answered(id, index, out);
            } else {
                self.tell(out, asker, EtcdPeer::ReadIndexAnswer { id, index });
            }
        }
    }

    /// The read index `id` asked for came: serve what it was for. An answer the read loop no longer
    /// waits for (answered already, or asked again under another id) is ignored.
    fn answered(&mut self, id: u64, index: usize, out: &mut MOut) {
        let Some(k) = self.asking.iter().position(|a| a.ids.contains(&id)) else { return };
        match self.asking.remove(k).then {
            Then::Read(read) => self.read_at(index, read, out),
            // `ensureLeadership`: the lessor answers if this member still leads.
            Then::Renew(origin, request) if self.role == Role::Leader => self.answer_from_lessor(origin, request, out),
            Then::Renew(..) => {}
        }
    }

    /// Whether the leader confirms it still leads before it answers `request` from its lessor: etcd
    /// 3.5.13 and 3.4.31 do for a keep-alive (`LeaseRenew`'s `ensureLeadership`, a `ReadIndex` round),
    /// the fix of etcd#15247; before them a leader stuck after losing its leadership went on renewing
    /// leases the new leader was about to expire.
    fn confirms_before_renewing(&self, request: &EtcdRequest) -> bool {
        self.version.fixes_15247() && matches!(request, EtcdRequest::LeaseKeepAlive { .. })
    }

    /// The leader's lessor answers `request` (a keep-alive renews in memory, not through the log). A
    /// keep-alive of a lease it finds expired waits for the lease's revoke or the lessor's demotion
    /// (`lessor.Renew`, 3.4 and 3.5): a deposed leader that resumes from a pause does not tell a
    /// client its lease is gone while the new leader still keeps it.
    fn answer_from_lessor(&mut self, origin: Origin, request: EtcdRequest, out: &mut MOut) {
        if let EtcdRequest::LeaseKeepAlive { id } = request {
            if self.state.leases.get(id).is_some_and(|l| l.expiry_ms <= self.now_ms) {
                self.renewing.push((id, origin, request));
                return;
            }
        }
        let reply = self.state.request(self.now_ms, origin.client, request, &mut Out::default());
        let reply = reply.unwrap_or_else(EtcdReply::Error);
        if origin.member == self.me {
            out.reply(origin.id, reply);
        } else {
            self.tell(out, origin.member, EtcdPeer::LessorAnswer { origin, reply });
        }
    }

    /// Serve a read once this member has applied `index`.
    fn read_at(&mut self, index: usize, read: Read, out: &mut MOut) {
        if self.applied >= index {
            self.serve_read(read, out);
        } else {
            self.applying.push((index, read));
        }
    }

    /// Serve a read from this member's store; one older than the cluster had committed when the
    /// member took the read is marked (`stale-read`). A correct read index is never below that: the
    /// leader that confirms it has committed everything committed before.
    fn serve_read(&mut self, read: Read, out: &mut MOut) {
        if self.applied < read.floor {
            out.out.mark(Hazard::StaleRead);
        }
        self.serve(read.origin, read.request, out);
    }

    /// Answer `request` from this member's store (a read, a watch).
    fn serve(&mut self, origin: Origin, request: EtcdRequest, out: &mut MOut) {
        let reply = self.state.request(self.now_ms, origin.client, request, &mut out.out);
        out.reply(origin.id, reply.unwrap_or_else(EtcdReply::Error));
    }

    /// Whether `(last_index, last_term)` is at least as up to date as this member's log.
    fn log_ok(&self, last_index: usize, last_term: u64) -> bool {
        let mine = self.term_at(self.last_index());
        last_term > mine || (last_term == mine && last_index >= self.last_index())
    }

    /// `CheckQuorum`'s leader lease: it heard from a leader within the election timeout.
    fn in_lease(&self) -> bool {
        self.leader.is_some() && self.election_elapsed < ELECTION_TICKS
    }

    /// One Raft tick.
    fn tick(&mut self, out: &mut MOut) {
        self.election_elapsed += 1;
        if self.role == Role::Leader {
            if self.election_elapsed >= ELECTION_TICKS {
                self.election_elapsed = 0;
                if self.recent_active.len() < self.quorum() {
                    let term = self.term;
                    self.become_follower(term, None, out);
                    return;
                }
                self.recent_active = BTreeSet::from([self.me]);
            }
            let read = self.reads.last().map_or(0, |r| r.id);
            for p in self.peers() {
                self.send_append(p, read, out);
            }
        } else if self.election_elapsed >= self.randomized_timeout {
            self.campaign(true, out);
        }
    }

    /// The primary lessor's look: revoke each expired lease through the log.
    fn look(&mut self, out: &mut MOut) {
        if !self.primary {
            return;
        }
        for id in self.state.leases.expired(self.now_ms) {
            if self.revoking.insert(id) {
                self.state.mark_expired(id, &mut out.out);
                self.append(Cmd::Expire(id), out);
            }
        }
    }

    fn on_append(&mut self, from: usize, append: Append, out: &mut MOut) {
        let Append { term, prev_index, prev_term, entries, commit, read } = append;
        if term < self.term {
            let msg = EtcdPeer::AppendAnswer { term: self.term, ok: false, matched: 0, read };
            self.tell(out, from, msg);
            return;
        }
        if term > self.term || self.role != Role::Follower || self.leader != Some(from) {
            self.become_follower(term, Some(from), out);
        } else {
            self.election_elapsed = 0;
        }
        if prev_index > self.last_index() || self.term_at(prev_index) != prev_term {
            let matched = prev_index.saturating_sub(1).min(self.last_index());
            self.tell(out, from, EtcdPeer::AppendAnswer { term, ok: false, matched, read });
            return;
        }
        for (k, entry) in entries.iter().enumerate() {
            let index = prev_index + 1 + k;
            if index <= self.last_index() && self.term_at(index) != entry.term {
                self.log.truncate(index - 1);
            }
            if index > self.last_index() {
                self.log.push(entry.clone());
            }
        }
        let matched = prev_index + entries.len();
        self.commit = self.commit.max(commit.min(matched));
        self.apply_committed(out);
        self.tell(out, from, EtcdPeer::AppendAnswer { term, ok: true, matched, read });
    }

    fn on_append_answer(&mut self, from: usize, term: u64, ok: bool, matched: usize, read: u64, out: &mut MOut) {
        if term > self.term {
            self.become_follower(term, None, out);
            return;
        }
        if self.role != Role::Leader || term != self.term {
            return;
        }
        self.recent_active.insert(from);
        if ok {
            self.match_index[from] = self.match_index[from].max(matched);
            self.next_index[from] = self.match_index[from] + 1;
            self.maybe_commit(out);
        } else {
            self.next_index[from] = (matched + 1).min(self.next_index[from]).max(1);
            self.send_append(from, 0, out);
        }
        if read > 0 {
            self.acknowledged(from, read, out);
        }
    }
}

/// The leader's entries after `prev_index` (none: a heartbeat), and its commit; `read`: the newest read
/// it wants confirmed (0: none).
#[derive(Debug, Clone)]
pub struct Append {
    term: u64,
    prev_index: usize,
    prev_term: u64,
    entries: Vec<Entry>,
    commit: usize,
    read: u64,
}

impl Member for EtcdMember {
    type Request = EtcdRequest;
    type Reply = EtcdReply;
    type Peer = EtcdPeer;

    fn start(&mut self, now: Now, out: &mut MOut) {
        self.now_ms = now.mono_ms;
        self.life += 1;
        self.role = Role::Follower;
        self.leader = None;
        self.primary = false;
        self.votes.clear();
        self.revoking.clear();
        self.waiting.clear();
        self.renewing.clear();
        self.reads.clear();
        self.held_reads.clear();
        self.asking.clear();
        self.applying.clear();
        // What it had not applied yet it applies from its log once it learns the commit again.
        self.behind.clear();
        // Watches lived in the old process's memory.
        self.state.watchers = super::watch::Watchers::default();
        self.reset_timeout();
        let _ = out;
    }

    fn request(&mut self, now: Now, via: Connection, id: RequestId, request: EtcdRequest, out: &mut MOut) {
        self.now_ms = now.mono_ms;
        let origin = Origin { member: self.me, life: self.life, id, client: via.peer };
        match request {
            // Watches are the store's, not the loop's.
            EtcdRequest::Watch { .. } | EtcdRequest::CancelWatch { .. } => self.serve(origin, request, out),
            // A stalled leader still thinks it leads, and its lessor is still primary: before 3.5.13
            // it renews a lease without asking anyone (etcd#15247).
            EtcdRequest::LeaseKeepAlive { .. }
                if self.stalled && self.primary && !self.confirms_before_renewing(&request) =>
            {
                self.answer_from_lessor(origin, request, out)
            }
            request if self.stalled => self.held.push(Held::Request(origin, request)),
            request => self.route(origin, request, out),
        }
    }

    fn peer(&mut self, now: Now, from: NodeIx, msg: EtcdPeer, out: &mut MOut) {
        self.now_ms = now.mono_ms;
        if self.stalled {
            self.held.push(Held::Peer(from, msg));
            return;
        }
        let Some(from) = self.members.iter().position(|m| *m == from) else { return };
        match msg {
            EtcdPeer::PreVote { term, last_index, last_term } => {
                if term > self.term && self.in_lease() {
                    return;
                }
                let granted = term > self.term && self.log_ok(last_index, last_term);
                let term = if granted { term } else { self.term };
                self.tell(out, from, EtcdPeer::PreVoteAnswer { term, granted });
            }
            EtcdPeer::PreVoteAnswer { term, granted } => {
                if granted && self.role == Role::PreCandidate && term == self.term + 1 {
                    self.votes.insert(from);
                    if self.votes.len() >= self.quorum() {
                        self.won(true, out);
                    }
                } else if !granted && term > self.term {
                    self.become_follower(term, None, out);
                }
            }
            EtcdPeer::Vote { term, last_index, last_term } => {
                if term > self.term && self.in_lease() {
                    return;
                }
                if term > self.term {
                    self.become_follower(term, None, out);
                }
                let free = self.voted_for.is_none_or(|v| v == from);
                let granted = term == self.term && free && self.log_ok(last_index, last_term);
                if granted {
                    self.voted_for = Some(from);
                    self.reset_timeout();
                }
                self.tell(out, from, EtcdPeer::VoteAnswer { term: self.term, granted });
            }
            EtcdPeer::VoteAnswer { term, granted } => {
                if term > self.term {
                    self.become_follower(term, None, out);
                } else if granted && self.role == Role::Candidate && term == self.term {
                    self.votes.insert(from);
                    if self.votes.len() >= self.quorum() {
                        self.won(false, out);
                    }
                }
            }
            EtcdPeer::Append(append) => self.on_append(from, append, out),
            EtcdPeer::AppendAnswer { term, ok, matched, read } => {
                self.on_append_answer(from, term, ok, matched, read, out)
            }
            EtcdPeer::Propose { origin, request } | EtcdPeer::Lessor { origin, request } => {
                self.route(origin, request, out)
            }
            EtcdPeer::ReadIndex { asker, id } => self.read_index(asker, id, out),
            EtcdPeer::ReadIndexAnswer { id, index } => self.answered(id, index, out),
            EtcdPeer::LessorAnswer { origin, reply } => {
                if origin.life == self.life {
                    out.reply(origin.id, reply);
                }
            }
        }
    }

    /// A client's or a peer's process died: etcd keeps leases past their connections, until their TTL.
    fn closed(&mut self, _: Now, _: NodeIx, _: u32, _: &mut MOut) {}

    fn wake(&mut self, now: Now, out: &mut MOut) {
        self.now_ms = now.mono_ms;
        if self.stalled {
            // Raft's ticks are lost while its loop does not take them (`node.Tick`: "A tick missed to
            // fire"), and the lessor's expired leases wait for the loop to revoke them.
            while self.next_tick_ms <= now.mono_ms {
                self.next_tick_ms += TICK_MS;
            }
            if self.next_look_ms <= now.mono_ms {
                self.next_look_ms = now.mono_ms + LESSOR_LOOK_MS;
            }
            return;
        }
        for held in std::mem::take(&mut self.held) {
            match held {
                Held::Peer(from, msg) => self.peer(now, from, msg, out),
                Held::Request(origin, request) => self.route(origin, request, out),
            }
        }
        if self.behind.front().is_some_and(|(at, _)| *at <= now.mono_ms) {
            self.apply_committed(out);
        }
        if self.next_tick_ms <= now.mono_ms {
            // Go's `time.Ticker` keeps one tick for a reader that is late and drops the rest: a
            // member paused for seconds takes one tick when it resumes, not one for each it slept.
            while self.next_tick_ms <= now.mono_ms {
                self.next_tick_ms += TICK_MS;
            }
            self.tick(out);
        }
        if self.asking.iter().any(|a| a.retry_ms <= now.mono_ms) {
            self.ask_again(out);
        }
        if self.next_look_ms <= now.mono_ms {
            // `runLoop` sleeps 500 ms after each look: a paused member looks late, once.
            self.next_look_ms = now.mono_ms + LESSOR_LOOK_MS;
            self.look(out);
        }
    }

    fn next_wake_ms(&self) -> Option<i64> {
        let timers = self.next_tick_ms.min(self.next_look_ms);
        if self.stalled {
            // Applying and the read loop's retries wait for the loop (a retry blocks on `ReadIndex`).
            return Some(timers);
        }
        let behind = self.behind.front().map_or(i64::MAX, |(at, _)| *at);
        let retry = self.asking.iter().map(|a| a.retry_ms).min().unwrap_or(i64::MAX);
        Some(timers.min(behind).min(retry))
    }

    /// `stall`: its consensus loop stops, or (released) takes up what it held at its next tick. `lag`:
    /// the commits it learns from now on are applied that late.
    fn member_fault(&mut self, fault: MemberFault) -> Result<(), String> {
        match fault {
            MemberFault::Stall(stalled) => self.stalled = stalled,
            MemberFault::Lag(lag) => self.lag_ms = lag.map_or(0, |d| d.as_millis() as i64),
        }
        Ok(())
    }

    /// etcd reads each client's gRPC connection and each peer's stream on goroutines of their own, all
    /// feeding one Raft loop, and its read loop, ticker and lessor run on goroutines of their own: after
    /// a pause, which connection's backlog goes first, and when the due timers fire among them, is up
    /// to the Go scheduler. They reach Raft through one channel (`raft.node`'s `recvc`), whose blocked
    /// senders queue in turn: each goroutine hands in one input, then waits behind the others for
    /// its next. So the model takes the backlog in rounds, one input from each source a round, in an
    /// order drawn afresh each round. (So a read loop's retry can reach Raft between two
    /// acknowledgements of its earlier round: etcd#20418.)
    const READS_ON_THREADS: bool = true;

    fn backlog_order(&mut self, sources: &[Source]) -> Vec<usize> {
        let mut queues: Vec<(Source, VecDeque<usize>)> = Vec::new();
        for (i, c) in sources.iter().enumerate() {
            match queues.iter_mut().find(|(q, _)| q == c) {
                Some((_, queue)) => queue.push_back(i),
                None => queues.push((*c, VecDeque::from([i]))),
            }
        }
        let rng = self.rng.as_mut().expect("a member's generator is set when it starts");
        let mut order = Vec::with_capacity(sources.len());
        while order.len() < sources.len() {
            // A round: each source with an input left hands one in, in an order drawn afresh.
            let mut turn: Vec<usize> = (0..queues.len()).filter(|q| !queues[*q].1.is_empty()).collect();
            for k in (1..turn.len()).rev() {
                turn.swap(k, rng.gen_range(0..=k));
            }
            order.extend(turn.into_iter().map(|q| queues[q].1.pop_front().expect("a source with an input left")));
        }
        order
    }
}

/// Which etcd release a cluster behaves as, where releases differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// 3.5.28 and later (and 3.4.42, 3.6.9): a read loop asks again for a read index under a new
    /// request id, so a late acknowledgement cannot confirm the retry (the fix of etcd#20418).
    V3_5_28,
    /// 3.5.13 to 3.5.27 (and 3.4.31 to 3.4.41): a leader confirms it leads before it renews a lease,
    /// but a read index is confirmed by any acknowledgement carrying its request id (etcd#20418).
    V3_5_13,
    /// Up to 3.5.12 (and 3.4.30): a leader also renews a lease on its own word (etcd#15247).
    V3_5_12,
}

impl Version {
    fn fixes_15247(self) -> bool {
        self != Version::V3_5_12
    }

    fn fixes_20418(self) -> bool {
        self == Version::V3_5_28
    }
}

/// A cluster of `n` members (`etcd-0` …) on new server nodes of `world`, which gives them its member faults.
pub fn deploy(world: &mut World, n: usize, version: Version) -> (Vec<NodeIx>, Vec<Arc<Mutex<EtcdMember>>>) {
    let first = world.next_index().0;
    let members: Vec<NodeIx> = (0..n as u32).map(|i| NodeIx(first + i)).collect();
    let cluster_commit = Arc::new(AtomicUsize::new(0));
    let states: Vec<Arc<Mutex<EtcdMember>>> = (0..n)
        .map(|i| {
            let mut member = EtcdMember::new(i, members.clone(), version);
            member.cluster_commit = cluster_commit.clone();
            Arc::new(Mutex::new(member))
        })
        .collect();
    for (i, state) in states.iter().enumerate() {
        let state = state.clone();
        let program: Program = Arc::new(move |env| {
            let state = state.clone();
            {
                // The election timeouts and the phase of the tick and lessor loops, per member and life.
                let mut rng =
                    stream(env.seed, Stream::EtcdRaft, (u64::from(env.me.0) << 32) | u64::from(env.incarnation));
                let now = env.clock.monotonic_ms();
                let mut m = state.lock().expect("etcd member lock");
                m.next_tick_ms = now + rng.gen_range(0..TICK_MS);
                m.next_look_ms = now + rng.gen_range(0..LESSOR_LOOK_MS);
                m.rng = Some(rng);
            }
            Box::pin(async move {
                let rpc = env.rpc();
                serve_member(state, &rpc, &env.clock, &env.recorder).await
            })
        });
        let node = world.add_server(&format!("etcd-{i}"), program);
        assert_eq!(node, members[i], "a cluster's members are added one after the other");
    }
    world.net().set_read_timeout(&members, PEER_READ_TIMEOUT);
    world.set_member_faults(member_faults(members.clone(), states.clone()));
    (members, states)
}

#[cfg(test)]
mod tests;
