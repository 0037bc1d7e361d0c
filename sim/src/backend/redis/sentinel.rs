//! Redis Sentinel 7.0, simulated: three Sentinels watch one master and its replicas (one or two),
//! agree that the master is down, elect one of themselves, and promote a replica.
//!
//! Modelled behaviour, from `sentinel.c` (7.0) and the Sentinel documentation:
//! - Each Sentinel's timer runs 10 to 19 times a second, the rate drawn at each run (`sentinelTimer`
//!   sets `server.hz` so, to desynchronise the Sentinels: three whose timers stay in step ask for
//!   votes at the same instant and split them). It PINGs every instance once `min(down-after-
//!   milliseconds, 1 s)` has passed since its last reply, and asks `INFO` every 10 s — every second of
//!   a replica while its master is objectively down or failing over (`sentinelSendPeriodicCommands`).
//!   At most one PING and one INFO are in flight per instance: a real Sentinel's link holds the rest.
//! - Each link to an instance is a connection of its own: one at least 15 s old whose pending PING and
//!   last PONG are both older than half `down-after-milliseconds` is closed and dialled again
//!   (`sentinelCheckSubjectivelyDown`, `SENTINEL_MIN_LINK_RECONNECT_PERIOD`), and a `+switch-master`
//!   makes every instance, and its link, anew. In a partition the new connection's SYN waits for the
//!   heal ([`crate::net::Rpc::reconnect`]), so the old master is reached again at its next SYN
//!   retransmission, not at an old link's data retransmission minutes later.
//! - An instance is subjectively down (SDOWN) once its oldest unanswered PING is older than
//!   `down-after-milliseconds` (`act_ping_time`, `sentinelCheckSubjectivelyDown`); a reply clears it.
//! - While it sees the master SDOWN, a Sentinel asks each other Sentinel `SENTINEL
//!   is-master-down-by-addr` once a second; a peer's "down" counts for 5 s after its reply. The master is
//!   objectively down (ODOWN) when this Sentinel and enough peers to make `quorum` say so
//!   (`sentinelCheckObjectivelyDown`).
//! - An ODOWN master is failed over by one Sentinel at a time: a Sentinel that starts a failover takes a
//!   new epoch (`current_epoch + 1`) and asks the others for their vote in it at once, then every second
//!   (`sentinelStartFailover`: its start time is set up to 1 s ahead, drawn, to desynchronise
//!   Sentinels). Each Sentinel votes once per epoch, for the first asker (`sentinelVoteLeader`); a voter
//!   for another Sentinel pushes its own next failover back. A Sentinel with a majority of all Sentinels
//!   and at least `quorum` votes is the leader; one that is not elected within `min(10 s,
//!   failover-timeout)` gives up, and no Sentinel starts a failover of the same master again within
//!   twice `failover-timeout` of its last start (`sentinelStartFailoverIfNeeded`). The failover's
//!   state machine takes one step per timer (`sentinelFailoverStateMachine`).
//! - The leader picks a replica that is up, answered within 5 s, and reported by `INFO` within 5 s, by
//!   the highest replication offset (then the lowest run id; every replica has the default
//!   priority), sends it `REPLICAOF NO ONE`, and waits for its `INFO` to report it a master (within
//!   `failover-timeout`, else it aborts). It then sends every other replica `REPLICAOF <promoted>`
//!   (all at once: `parallel-syncs` is not modelled) and waits until each that is up reports the new
//!   master, or `failover-timeout` (`sentinelFailoverDetectEnd`); then it switches its configuration
//!   to the promoted replica (`+switch-master`) with the failover's epoch as its configuration epoch;
//!   the old master becomes a replica in its view.
//! - Every 2 s each Sentinel tells the others its configuration (the hello message); a Sentinel that
//!   hears a newer configuration epoch switches to it (`sentinelProcessHelloMessage`). Sentinels here
//!   know each other from the start (real ones discover each other through the same hellos).
//! - An instance a Sentinel sees as a replica but whose `INFO` reports a master — the old master, back
//!   after a partition — is sent `REPLICAOF <master>` (`+convert-to-slave`) once it has not been down
//!   for 8 s, has reported the master role for 8 s, and the master looks sane (up, and its `INFO` fresh;
//!   `sentinelRefreshInstanceInfo`). It then resynchronises from the new master and loses what only it
//!   had. A replica that follows another master is pointed at this one once it has been up, and has
//!   named that master in its `INFO`, for `failover-timeout` (`+fix-slave-config`, by
//!   `slave_conf_change_time`).
//! - Clients ask `SENTINEL masters`, which answers with the master's node and whether this Sentinel
//!   sees it down (redis-py's `discover_master` skips a Sentinel whose answer says down).
//!
//! - A Sentinel's `REPLICAOF` comes with `CLIENT KILL TYPE normal` and `TYPE pubsub`, closing the
//!   instance's clients' connections ([`super::RedisState`]).
//!
//! Checked against real Sentinels by `locksim conform redis-sentinel`.
//!
//! Not modelled: TILT mode (Sentinel's timers read the node's monotonic clock here, so clock jumps do
//! not move them), replica priorities, `parallel-syncs`, Sentinels' own SDOWN, the discovery of
//! Sentinels and replicas, and the pub/sub link (hellos go from Sentinel to Sentinel).

use super::{RedisReply, RedisRequest};
use crate::backend::{Backend, Now, Out};
use crate::history::NodeIx;
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use crate::world::Program;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A Sentinel's timer runs at `hz` 10 to 19, drawn again at each run (`sentinelTimer`: "continuously
/// change the frequency … in order to desynchronize every Sentinel from every other", so that
/// Sentinels started together do not keep asking for votes at the same instant and split them): the
/// first run is within this of a life's start.
const TIMER_MS: i64 = 100;
/// `CONFIG_DEFAULT_HZ`.
const DEFAULT_HZ: i64 = 10;
/// `SENTINEL_PING_PERIOD`: the longest wait between PINGs.
const PING_PERIOD_MS: i64 = 1_000;
/// `SENTINEL_INFO_PERIOD`.
const INFO_PERIOD_MS: i64 = 10_000;
/// `SENTINEL_ASK_PERIOD`: how often a Sentinel asks its peers about a master it sees down; a peer's
/// answer counts for five of them.
const ASK_PERIOD_MS: i64 = 1_000;
/// `SENTINEL_PUBLISH_PERIOD`: the hello messages.
const HELLO_PERIOD_MS: i64 = 2_000;
/// `SENTINEL_MAX_DESYNC`: a failover's start time is put up to this far ahead.
const MAX_DESYNC_MS: i64 = 1_000;
/// `SENTINEL_ELECTION_TIMEOUT`.
const ELECTION_TIMEOUT_MS: i64 = 10_000;
/// `SENTINEL_MIN_LINK_RECONNECT_PERIOD`: a link younger than this is never recycled.
const MIN_LINK_RECONNECT_PERIOD_MS: i64 = 15_000;

/// What a replication instance reports of itself in `INFO replication`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// The master it follows; `None`: it is a master.
    pub replica_of: Option<NodeIx>,
    /// Its replication offset (`master_repl_offset`, `slave_repl_offset`).
    pub offset: u64,
}

/// Sentinel traffic: Sentinels with the instances they watch, with each other, and with clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentinelMsg {
    /// Sentinel → instance: `PING`, and `INFO replication` when `info`. Answered by [`SentinelMsg::Probed`].
    Probe { info: bool },
    /// Instance → Sentinel: the answer to a probe (`PONG`, and the role when `INFO` was asked).
    Probed { role: Option<Role> },
    /// Client → Sentinel: `SENTINEL masters`, as a client asks which node is the master. Answered with
    /// `[master node, 1 if this Sentinel sees it down else 0]`.
    Masters,
    /// Sentinel → Sentinel: `SENTINEL is-master-down-by-addr <master> <current epoch> <run id or *>`;
    /// with a candidate, a request for this Sentinel's vote in `epoch`. Answered by
    /// [`SentinelMsg::MasterDown`].
    IsMasterDown { epoch: u64, candidate: Option<NodeIx> },
    /// The answer: whether the asked Sentinel sees the master down, and whom it voted for in which epoch.
    MasterDown { down: bool, leader: Option<(NodeIx, u64)> },
    /// Sentinel → Sentinel, every 2 s: its epoch and its configuration of the master.
    Hello { current_epoch: u64, master: NodeIx, config_epoch: u64 },
}

/// The Sentinels' settings (`sentinel monitor`, `down-after-milliseconds`, `failover-timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentinelConfig {
    pub down_after: Duration,
    pub failover_timeout: Duration,
    pub quorum: usize,
}

/// One Sentinel's link to an instance it watches: a connection of its own, which it closes and dials
/// again when a PING has waited too long ([`SentinelState::check_down`]).
#[derive(Debug, Clone, Default)]
struct Link {
    /// When its connection was opened (`cc_conn_time`).
    conn_ms: i64,
    /// When the oldest unanswered PING was sent (`act_ping_time`).
    ping_pending_since: Option<i64>,
    last_ping_ms: Option<i64>,
    last_pong_ms: Option<i64>,
    /// When an INFO was last sent, and when one was last answered (`info_refresh`).
    info_sent_ms: Option<i64>,
    info_ms: Option<i64>,
    /// The role its last INFO reported, and since when it has reported that role
    /// (`role_reported_time`).
    role: Option<Role>,
    role_since_ms: i64,
    /// The master its INFO last named as a replica (`slave_master_host`/`port`), and since when
    /// (`slave_conf_change_time`: the instance's creation, a report of the replica role, a report of
    /// another master).
    master_reported: Option<NodeIx>,
    conf_change_ms: i64,
    /// Since when it has been subjectively down (`s_down_since_time`; never cleared, as in Redis).
    down_since_ms: Option<i64>,
    down: bool,
}

impl Link {
    /// A link to an instance made `now` (`createSentinelRedisInstance`), with the role it is known by.
    fn new(role: Option<Role>, now: i64) -> Link {
        Link { conn_ms: now, role, role_since_ms: now, conf_change_ms: now, ..Link::default() }
    }
}

/// What this Sentinel last heard from a peer Sentinel.
#[derive(Debug, Clone, Default)]
struct Peer {
    says_down: bool,
    /// Whom it voted for, in which epoch (`ri->leader`, `ri->leader_epoch`).
    leader: Option<(NodeIx, u64)>,
    reply_ms: Option<i64>,
    asked_ms: Option<i64>,
}

/// A failover this Sentinel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failover {
    /// Waiting to be elected leader of `epoch`.
    WaitStart { epoch: u64 },
    /// Elected: the replica is chosen at the next timer (`+failover-state-select-slave`).
    SelectReplica { epoch: u64 },
    /// `REPLICAOF NO ONE` sent to `promoted` at `since`; waiting for its INFO to say master.
    WaitPromotion { epoch: u64, promoted: NodeIx, since: i64 },
    /// The other replicas were sent `REPLICAOF promoted` at `since`; waiting for their INFO to say so.
    ReconfReplicas { promoted: NodeIx, since: i64 },
}

/// One Sentinel: its view of the master it watches, and of its peers.
#[derive(Debug)]
pub struct SentinelState {
    config: SentinelConfig,
    me: NodeIx,
    peers: Vec<NodeIx>,
    current_epoch: u64,
    config_epoch: u64,
    master: NodeIx,
    replicas: Vec<NodeIx>,
    links: BTreeMap<NodeIx, Link>,
    peer_views: BTreeMap<NodeIx, Peer>,
    o_down: bool,
    /// This Sentinel's vote for the master's failover (`master->leader`, `leader_epoch`).
    vote: Option<(NodeIx, u64)>,
    failover: Option<Failover>,
    /// `failover_start_time`: `None` is Redis's 0, "may fail over at once".
    failover_start_ms: Option<i64>,
    last_hello_ms: Option<i64>,
    /// This life's generator: the failover start's desynchronisation.
    rng: Option<ChaCha8Rng>,
    /// The monotonic time of this life's first timer (set by the node when it starts).
    pub first_tick_ms: Option<i64>,
    /// How long until the next timer: `1000 / hz`, `hz` drawn at each timer ([`DEFAULT_HZ`]).
    timer_ms: i64,
}

impl SentinelState {
    /// Sentinel `me` among `sentinels` (itself included), watching `master` and its `replicas`.
    pub fn new(
        config: SentinelConfig,
        me: NodeIx,
        sentinels: &[NodeIx],
        master: NodeIx,
        replicas: Vec<NodeIx>,
    ) -> Self {
        SentinelState {
            config,
            me,
            peers: sentinels.iter().copied().filter(|s| *s != me).collect(),
            current_epoch: 0,
            config_epoch: 0,
            master,
            replicas,
            links: BTreeMap::new(),
            peer_views: BTreeMap::new(),
            o_down: false,
            vote: None,
            failover: None,
            failover_start_ms: None,
            last_hello_ms: None,
            rng: None,
            first_tick_ms: None,
            timer_ms: TIMER_MS,
        }
    }

    /// A new life of the process (Sentinel keeps its configuration in its file: the master, the epochs
    /// and its vote survive; its links and its peers' answers do not), with its generator.
    pub fn restart(&mut self, rng: ChaCha8Rng, first_tick_ms: i64) {
        self.links.clear();
        self.peer_views.clear();
        self.o_down = false;
        self.failover = None;
        self.rng = Some(rng);
        self.first_tick_ms = Some(first_tick_ms);
    }

    /// The master this Sentinel names.
    pub fn master(&self) -> NodeIx {
        self.master
    }

    /// The master of this Sentinel's configuration: once its failover is reconfiguring the replicas,
    /// the promoted one, which its hellos announce with the failover's epoch
    /// (`sentinelGetCurrentMasterAddress`).
    fn current_master(&self) -> NodeIx {
        match self.failover {
            Some(Failover::ReconfReplicas { promoted, .. }) => promoted,
            _ => self.master,
        }
    }

    fn down_after_ms(&self) -> i64 {
        self.config.down_after.as_millis() as i64
    }

    fn failover_timeout_ms(&self) -> i64 {
        self.config.failover_timeout.as_millis() as i64
    }

    fn master_down(&self) -> bool {
        self.links.get(&self.master).is_some_and(|l| l.down)
    }

    fn desync(&mut self) -> i64 {
        self.rng.as_mut().map_or(0, |r| r.gen_range(0..MAX_DESYNC_MS))
    }

    /// PING and INFO every instance as they are due (`sentinelSendPeriodicCommands`).
    fn probe(&mut self, now: i64, out: &mut Out) {
        let ping_period = self.down_after_ms().min(PING_PERIOD_MS);
        let busy = self.o_down || self.failover.is_some();
        let master = self.master;
        for node in std::iter::once(master).chain(self.replicas.clone()) {
            let info_period = if node != master && busy { PING_PERIOD_MS } else { INFO_PERIOD_MS };
            let link = self.links.entry(node).or_insert_with(|| Link::new(None, now));
            let stale = |at: Option<i64>, period: i64| at.is_none_or(|t| now - t > period);
            let info = stale(link.info_ms, info_period) && stale(link.info_sent_ms, info_period);
            let ping = stale(link.last_pong_ms, ping_period) && stale(link.last_ping_ms, ping_period);
            if info {
                link.info_sent_ms = Some(now);
            }
            if ping || info {
                link.last_ping_ms = Some(now);
                link.ping_pending_since.get_or_insert(now);
                out.push(node, RedisRequest::Sentinel(SentinelMsg::Probe { info }));
            }
        }
    }

    /// SDOWN of every instance (`sentinelCheckSubjectivelyDown`). First, a link older than
    /// [`MIN_LINK_RECONNECT_PERIOD_MS`] whose pending PING and last PONG are both older than half
    /// `down-after` is closed and dialled again (in a partition the new connection's SYN waits for
    /// the heal); the PING still counts from the first unanswered one (`act_ping_time` is kept), and
    /// the next timer PINGs on the new connection (`sentinelReconnectInstance`: "Send a PING ASAP").
    fn check_down(&mut self, now: i64, out: &mut Out) {
        let down_after = self.down_after_ms();
        for (node, link) in self.links.iter_mut() {
            let old = |at: Option<i64>| at.is_none_or(|t| now - t > down_after / 2);
            let stuck = link.ping_pending_since.is_some_and(|t| now - t > down_after / 2) && old(link.last_pong_ms);
            if now - link.conn_ms > MIN_LINK_RECONNECT_PERIOD_MS && stuck {
                out.reconnect(*node);
                link.conn_ms = now;
                (link.last_ping_ms, link.info_sent_ms) = (None, None);
            }
            let down = link.ping_pending_since.is_some_and(|t| now - t > down_after);
            if down && !link.down {
                link.down_since_ms = Some(now);
            }
            link.down = down;
        }
    }

    /// Ask the peers about the master while it is SDOWN, once a second each, or at once when `forced`
    /// (`sentinelAskMasterStateToOtherSentinels`); forget answers older than five asks.
    fn ask_peers(&mut self, now: i64, forced: bool, out: &mut Out) {
        let candidate = self.failover.is_some().then_some(self.me);
        let down = self.master_down();
        for peer in self.peers.clone() {
            let view = self.peer_views.entry(peer).or_default();
            if view.reply_ms.is_some_and(|t| now - t > 5 * ASK_PERIOD_MS) {
                view.says_down = false;
                view.leader = None;
            }
            if !down {
                continue;
            }
            let answered_lately = view.reply_ms.is_some_and(|t| now - t < ASK_PERIOD_MS);
            let asked_lately = view.asked_ms.is_some_and(|t| now - t < ASK_PERIOD_MS);
            if !forced && (answered_lately || asked_lately) {
                continue;
            }
            view.asked_ms = Some(now);
            let epoch = self.current_epoch;
            out.push(peer, RedisRequest::Sentinel(SentinelMsg::IsMasterDown { epoch, candidate }));
        }
    }

    /// ODOWN (`sentinelCheckObjectivelyDown`).
    fn check_objectively_down(&mut self) {
        let agree = 1 + self.peer_views.values().filter(|p| p.says_down).count();
        self.o_down = self.master_down() && agree >= self.config.quorum;
    }

    /// `sentinelVoteLeader`: vote for `candidate` in `epoch` unless this Sentinel voted in it already.
    fn vote_for(&mut self, now: i64, epoch: u64, candidate: NodeIx) -> Option<(NodeIx, u64)> {
        self.current_epoch = self.current_epoch.max(epoch);
        if self.vote.is_none_or(|(_, e)| e < epoch) && self.current_epoch <= epoch {
            self.vote = Some((candidate, self.current_epoch));
            if candidate != self.me {
                self.failover_start_ms = Some(now + self.desync());
            }
        }
        self.vote
    }

    /// `sentinelGetLeader`: the Sentinel with a majority of all Sentinels' and at least `quorum` votes
    /// in `epoch`, counting this Sentinel's own vote (cast now if it has none in the epoch).
    fn leader(&mut self, now: i64, epoch: u64) -> Option<NodeIx> {
        let mut votes: BTreeMap<NodeIx, usize> = BTreeMap::new();
        for view in self.peer_views.values() {
            if let Some((leader, e)) = view.leader {
                if e == self.current_epoch {
                    *votes.entry(leader).or_default() += 1;
                }
            }
        }
        // The most voted (the lowest run id among equals), or itself.
        let most = votes.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(n, _)| *n);
        if let Some((mine, e)) = self.vote_for(now, epoch, most.unwrap_or(self.me)) {
            if e == epoch {
                *votes.entry(mine).or_default() += 1;
            }
        }
        let (winner, count) = votes.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
        let voters = self.peers.len() + 1;
        (*count > voters / 2 && *count >= self.config.quorum).then_some(*winner)
    }

    /// The replica to promote (`sentinelSelectSlave`): up, answered lately, INFO fresh; the highest
    /// offset, then the lowest run id.
    fn select_replica(&self, now: i64) -> Option<NodeIx> {
        let fresh = |at: Option<i64>, within: i64| at.is_some_and(|t| now - t <= within);
        let good = |n: &NodeIx| {
            self.links.get(n).is_some_and(|l| {
                !l.down && fresh(l.last_pong_ms, 5 * PING_PERIOD_MS) && fresh(l.info_ms, 5 * PING_PERIOD_MS)
            })
        };
        let offset = |n: &NodeIx| self.links[n].role.map_or(0, |r| r.offset);
        self.replicas.iter().filter(|n| good(n)).max_by(|a, b| offset(a).cmp(&offset(b)).then(b.cmp(a))).copied()
    }

    /// Start a failover of an ODOWN master unless one ran lately (`sentinelStartFailoverIfNeeded`);
    /// whether one started.
    fn start_failover_if_needed(&mut self, now: i64) -> bool {
        if !self.o_down || self.failover.is_some() {
            return false;
        }
        if self.failover_start_ms.is_some_and(|t| now - t < 2 * self.failover_timeout_ms()) {
            return false;
        }
        self.current_epoch += 1;
        self.failover = Some(Failover::WaitStart { epoch: self.current_epoch });
        self.failover_start_ms = Some(now + self.desync());
        true
    }

    /// One step of the failover state machine (`sentinelFailoverStateMachine`).
    fn run_failover(&mut self, now: i64, out: &mut Out) {
        match self.failover {
            None => {}
            Some(Failover::WaitStart { epoch }) => {
                let start = self.failover_start_ms.unwrap_or(now);
                if self.leader(now, epoch) == Some(self.me) {
                    self.failover = Some(Failover::SelectReplica { epoch }); // +elected-leader
                } else if now - start > ELECTION_TIMEOUT_MS.min(self.failover_timeout_ms()) {
                    self.failover = None; // -failover-abort-not-elected
                }
            }
            Some(Failover::SelectReplica { epoch }) => {
                match self.select_replica(now) {
                    None => self.failover = None, // -failover-abort-no-good-slave
                    Some(promoted) => {
                        out.push(promoted, RedisRequest::ReplicaOf { master: None });
                        self.failover = Some(Failover::WaitPromotion { epoch, promoted, since: now });
                    }
                }
            }
            Some(Failover::WaitPromotion { epoch, promoted, since }) => {
                let link = &self.links[&promoted];
                if link.role.is_some_and(|r| r.replica_of.is_none()) && link.info_ms.is_some_and(|t| t > since) {
                    self.config_epoch = epoch;
                    self.last_hello_ms = None; // sentinelForceHelloUpdateForMaster
                    for replica in self.replicas.iter().filter(|r| **r != promoted) {
                        out.push(*replica, RedisRequest::ReplicaOf { master: Some(promoted) });
                    }
                    self.failover = Some(Failover::ReconfReplicas { promoted, since: now });
                    self.run_failover(now, out);
                } else if now - since > self.failover_timeout_ms() {
                    self.failover = None; // -failover-abort
                }
            }
            Some(Failover::ReconfReplicas { promoted, since }) => {
                // Done when every other replica that is up follows the promoted one, or at the timeout
                // (`sentinelFailoverDetectEnd`); then `+switch-master`.
                let pending = self.replicas.iter().filter(|r| **r != promoted).any(|r| {
                    let link = &self.links[r];
                    !link.down && link.role.is_none_or(|role| role.replica_of != Some(promoted))
                });
                if !pending || now - since > self.failover_timeout_ms() {
                    self.switch_master(now, promoted, out);
                }
            }
        }
    }

    /// `+switch-master` (`sentinelResetMasterAndChangeAddress`): `to` is the master now, the old master
    /// one of its replicas; links start afresh — each instance is made anew, and its link with a new
    /// connection — and a new failover may start at once.
    fn switch_master(&mut self, now: i64, to: NodeIx, out: &mut Out) {
        let old = self.master;
        self.replicas.retain(|r| *r != to);
        self.replicas.push(old);
        self.replicas.sort();
        self.master = to;
        self.links.clear();
        for node in std::iter::once(to).chain(self.replicas.iter().copied()) {
            // A replica instance is made with the slave role reported (`createSentinelRedisInstance`).
            let role = (node != to).then_some(Role { replica_of: Some(to), offset: 0 });
            self.links.insert(node, Link::new(role, now));
            out.reconnect(node);
        }
        for view in self.peer_views.values_mut() {
            view.says_down = false;
            view.leader = None;
        }
        self.o_down = false;
        self.failover = None;
        self.failover_start_ms = None;
    }

    /// `sentinelMasterLooksSane`: up, a master by its INFO, and that INFO under 20 s old.
    fn master_looks_sane(&self, now: i64) -> bool {
        self.links.get(&self.master).is_some_and(|l| {
            !l.down
                && l.role.is_some_and(|r| r.replica_of.is_none())
                && l.info_ms.is_some_and(|t| now - t < 2 * INFO_PERIOD_MS)
        })
    }

    /// An INFO or PONG from `from` (`sentinelRefreshInstanceInfo`, `sentinelPingReplyCallback`).
    fn probed(&mut self, now: i64, from: NodeIx, role: Option<Role>, out: &mut Out) {
        let (sane, master, failover_timeout) = (self.master_looks_sane(now), self.master, self.failover_timeout_ms());
        let Some(link) = self.links.get_mut(&from) else { return };
        link.last_pong_ms = Some(now);
        link.ping_pending_since = None;
        link.down = false;
        let Some(role) = role else { return };
        link.info_ms = Some(now);
        let role_changed = link.role.map(|r| r.replica_of.is_some()) != Some(role.replica_of.is_some());
        if role_changed {
            link.role_since_ms = now;
        }
        if role.replica_of.is_some() && (role_changed || link.master_reported != role.replica_of) {
            link.conf_change_ms = now;
            link.master_reported = role.replica_of;
        }
        link.role = Some(role);
        // A replica in this Sentinel's view that says it is a master: convert it, once settled.
        let promoting = match self.failover {
            Some(Failover::WaitPromotion { promoted, .. } | Failover::ReconfReplicas { promoted, .. }) => {
                promoted == from
            }
            _ => false,
        };
        let up_for = |wait: i64| link.down_since_ms.is_none_or(|t| now - t > wait) && now - link.role_since_ms > wait;
        if from != master && role.replica_of.is_none() && !promoting && sane && up_for(4 * HELLO_PERIOD_MS) {
            out.push(from, RedisRequest::ReplicaOf { master: Some(master) }); // +convert-to-slave
        }
        // A replica that follows another master: point it at this one once it has been up, and has
        // named that master, for `failover-timeout` (+fix-slave-config).
        let elsewhere = role.replica_of.is_some_and(|m| m != master);
        let settled = link.down_since_ms.is_none_or(|t| now - t > failover_timeout)
            && now - link.conf_change_ms > failover_timeout;
        if from != master && elsewhere && self.failover.is_none() && sane && settled {
            out.push(from, RedisRequest::ReplicaOf { master: Some(master) });
        }
    }

    fn hello(&mut self, now: i64, out: &mut Out) {
        if self.last_hello_ms.is_some_and(|t| now - t < HELLO_PERIOD_MS) {
            return;
        }
        self.last_hello_ms = Some(now);
        let (current_epoch, master, config_epoch) = (self.current_epoch, self.current_master(), self.config_epoch);
        for peer in &self.peers {
            out.push(*peer, RedisRequest::Sentinel(SentinelMsg::Hello { current_epoch, master, config_epoch }));
        }
    }

    /// One message for this Sentinel; its reply, when the message is a call.
    fn receive(&mut self, now: i64, from: NodeIx, msg: SentinelMsg, out: &mut Out) -> RedisReply {
        match msg {
            SentinelMsg::Masters => {
                let down = self.master_down() || self.o_down;
                return RedisReply::Array(vec![
                    RedisReply::Int(self.master.0 as i64),
                    RedisReply::Int(i64::from(down)),
                ]);
            }
            SentinelMsg::Probed { role } => self.probed(now, from, role, out),
            SentinelMsg::IsMasterDown { epoch, candidate } => {
                let down = self.master_down();
                let leader = candidate.and_then(|c| self.vote_for(now, epoch, c));
                out.push(from, RedisRequest::Sentinel(SentinelMsg::MasterDown { down, leader }));
            }
            SentinelMsg::MasterDown { down, leader } => {
                let view = self.peer_views.entry(from).or_default();
                view.says_down = down;
                view.reply_ms = Some(now);
                if leader.is_some() {
                    view.leader = leader;
                }
            }
            SentinelMsg::Hello { current_epoch, master, config_epoch } => {
                self.current_epoch = self.current_epoch.max(current_epoch);
                if config_epoch > self.config_epoch {
                    self.config_epoch = config_epoch;
                    if master != self.master {
                        self.switch_master(now, master, out); // +config-update-from, +switch-master
                    }
                }
            }
            SentinelMsg::Probe { .. } => {}
        }
        RedisReply::Ok
    }
}

impl Backend for SentinelState {
    type Request = RedisRequest;
    type Reply = RedisReply;

    /// Sentinel's timers read the node's monotonic clock (TILT, Redis's answer to a wall clock that
    /// jumps, is not modelled).
    fn apply(&mut self, now: Now, from: NodeIx, request: RedisRequest, out: &mut Out) -> RedisReply {
        match request {
            RedisRequest::Sentinel(msg) => self.receive(now.mono_ms, from, msg, out),
            RedisRequest::Ping => RedisReply::Status("PONG".into()),
            _ => RedisReply::Error("ERR unknown command (this is a Sentinel)".into()),
        }
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.timer_ms as u64))
    }

    fn ticks_from(&self) -> Option<i64> {
        self.first_tick_ms
    }

    /// `sentinelHandleRedisInstance` for the master and its replicas.
    fn tick(&mut self, now: Now, out: &mut Out) {
        let now = now.mono_ms;

        self.probe(now, out);
        self.hello(now, out);
        self.check_down(now, out);
        self.check_objectively_down();
        if self.start_failover_if_needed(now) {
            self.ask_peers(now, true, out);
        }
        self.run_failover(now, out);
        self.ask_peers(now, false, out);
        if let Some(rng) = &mut self.rng {
            self.timer_ms = 1000 / (DEFAULT_HZ + rng.gen_range(0..DEFAULT_HZ));
        }
    }
}

/// Every Sentinel's state, for what no single node knows: whether the Sentinels have replaced a master
/// (hazard `deposed-master-write`).
#[derive(Debug, Clone, Default)]
pub struct Sentinels(pub Vec<Arc<Mutex<SentinelState>>>);

impl Sentinels {
    /// Whether the newest configuration any Sentinel holds names another master than `node`, which
    /// still acts as one. A configuration epoch is a failover a majority voted for, so the newest is
    /// the one the Sentinels converge to, whoever has not heard of it yet.
    pub fn deposed(&self, node: NodeIx) -> bool {
        let newest = self.0.iter().map(|s| {
            let s = s.lock().expect("sentinel lock");
            (s.config_epoch, s.current_master())
        });
        newest.max_by_key(|(epoch, _)| *epoch).is_some_and(|(_, master)| master != node)
    }
}

/// A Sentinel node's program: each life draws its timer's phase and its generator, then serves.
pub fn program(state: Arc<Mutex<SentinelState>>) -> Program {
    Arc::new(move |env| {
        let state = state.clone();
        {
            let index = (u64::from(env.me.0) << 32) | u64::from(env.incarnation);
            let mut rng = stream(env.seed, Stream::Sentinel, index);
            let first_tick_ms = env.clock.monotonic_ms() + rng.gen_range(0..TIMER_MS);
            state.lock().expect("sentinel lock").restart(rng, first_tick_ms);
        }
        Box::pin(async move {
            let rpc = env.rpc();
            crate::backend::serve(state, &rpc, &env.clock, &env.recorder).await
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: [NodeIx; 3] = [NodeIx(10), NodeIx(11), NodeIx(12)];
    const MASTER: NodeIx = NodeIx(1);
    const REPLICA: NodeIx = NodeIx(2);

    fn sentinel(me: usize) -> SentinelState {
        let config =
            SentinelConfig { down_after: Duration::from_secs(5), failover_timeout: Duration::from_secs(60), quorum: 2 };
        SentinelState::new(config, S[me], &S, MASTER, vec![REPLICA])
    }

    fn sent(out: &mut Out) -> Vec<(NodeIx, RedisRequest)> {
        out.pushes.drain(..).map(|(to, m)| (to, *m.downcast::<RedisRequest>().expect("a Redis request"))).collect()
    }

    fn tick(s: &mut SentinelState, ms: i64) -> Vec<(NodeIx, RedisRequest)> {
        let mut out = Out::default();
        s.tick(Now::at(ms), &mut out);
        sent(&mut out)
    }

    fn answer(s: &mut SentinelState, ms: i64, from: NodeIx, role: Option<Role>) -> Vec<(NodeIx, RedisRequest)> {
        let mut out = Out::default();
        s.apply(Now::at(ms), from, RedisRequest::Sentinel(SentinelMsg::Probed { role }), &mut out);
        sent(&mut out)
    }

    const AS_MASTER: Option<Role> = Some(Role { replica_of: None, offset: 7 });
    const AS_REPLICA: Option<Role> = Some(Role { replica_of: Some(MASTER), offset: 7 });

    #[test]
    fn a_master_is_subjectively_down_after_down_after_of_silence() {
        let mut s = sentinel(0);
        let first = tick(&mut s, 0);
        assert!(first.contains(&(MASTER, RedisRequest::Sentinel(SentinelMsg::Probe { info: true }))));
        answer(&mut s, 5, MASTER, AS_MASTER);
        answer(&mut s, 5, REPLICA, AS_REPLICA);
        // The master goes silent: the next PING (at 1.1 s) is never answered.
        for ms in (100..=6_100).step_by(100) {
            tick(&mut s, ms);
            answer(&mut s, ms, REPLICA, None);
        }
        assert!(!s.master_down(), "5 s after the unanswered PING of 1.1 s is 6.1 s: not yet");
        tick(&mut s, 6_200);
        assert!(s.master_down());
        assert!(!s.o_down, "one Sentinel is not a quorum of 2");
    }

    #[test]
    fn each_sentinel_votes_once_per_epoch_for_the_first_asker() {
        let mut s = sentinel(2);
        assert_eq!(s.vote_for(0, 1, S[0]), Some((S[0], 1)));
        assert_eq!(s.vote_for(0, 1, S[1]), Some((S[0], 1)), "the vote of epoch 1 is given");
        assert_eq!(s.vote_for(0, 2, S[1]), Some((S[1], 2)), "a new epoch, a new vote");
        assert_eq!(s.current_epoch, 2);
        assert!(s.failover_start_ms.is_some(), "a voter for another pushes its own failover back");
    }

    /// Sentinel 0 sees the master down, hears Sentinel 1 agree, starts a failover, collects a vote,
    /// promotes the replica and switches to it once its INFO says master.
    #[test]
    fn a_quorum_fails_over_to_the_replica() {
        let mut s = sentinel(0);
        tick(&mut s, 0);
        answer(&mut s, 5, MASTER, AS_MASTER);
        answer(&mut s, 5, REPLICA, AS_REPLICA);
        let mut ms = 100;
        while !s.master_down() {
            tick(&mut s, ms);
            answer(&mut s, ms, REPLICA, AS_REPLICA);
            ms += 100;
        }
        let mut out = Out::default();
        s.apply(
            Now::at(ms),
            S[1],
            RedisRequest::Sentinel(SentinelMsg::MasterDown { down: true, leader: None }),
            &mut out,
        );
        let asks = tick(&mut s, ms);
        assert!(s.o_down && s.failover.is_some());
        let epoch = s.current_epoch;
        assert!(
            asks.contains(&(S[1], RedisRequest::Sentinel(SentinelMsg::IsMasterDown { epoch, candidate: Some(S[0]) })))
        );
        let vote = SentinelMsg::MasterDown { down: true, leader: Some((S[0], epoch)) };
        s.apply(Now::at(ms + 10), S[1], RedisRequest::Sentinel(vote), &mut out);
        tick(&mut s, ms + 100);
        assert_eq!(s.failover, Some(Failover::SelectReplica { epoch }), "elected; the replica is chosen next");
        answer(&mut s, ms + 150, REPLICA, AS_REPLICA);
        let promote = tick(&mut s, ms + 200);
        assert!(promote.contains(&(REPLICA, RedisRequest::ReplicaOf { master: None })), "{promote:?}");
        answer(&mut s, ms + 250, REPLICA, Some(Role { replica_of: None, offset: 7 }));
        tick(&mut s, ms + 300);
        assert_eq!(s.master(), REPLICA);
        assert_eq!(s.config_epoch, epoch);
    }

    /// With two replicas the leader promotes the one with the higher offset, points the other at it,
    /// and switches once that one's INFO follows the new master.
    #[test]
    fn the_most_up_to_date_replica_is_promoted_and_the_other_follows_it() {
        const OTHER: NodeIx = NodeIx(3);
        let config =
            SentinelConfig { down_after: Duration::from_secs(5), failover_timeout: Duration::from_secs(60), quorum: 2 };
        let mut s = SentinelState::new(config, S[0], &S, MASTER, vec![REPLICA, OTHER]);
        s.links.insert(MASTER, Link { down: true, down_since_ms: Some(0), ..Link::default() });
        for (node, offset) in [(REPLICA, 5), (OTHER, 9)] {
            s.links.insert(node, Link::default());
            answer(&mut s, 0, node, Some(Role { replica_of: Some(MASTER), offset }));
        }
        s.failover = Some(Failover::SelectReplica { epoch: 1 });
        let mut out = Out::default();
        s.run_failover(100, &mut out);
        assert_eq!(sent(&mut out), vec![(OTHER, RedisRequest::ReplicaOf { master: None })], "offset 9 beats 5");
        answer(&mut s, 200, OTHER, Some(Role { replica_of: None, offset: 9 }));
        s.run_failover(300, &mut out);
        assert_eq!(sent(&mut out), vec![(REPLICA, RedisRequest::ReplicaOf { master: Some(OTHER) })]);
        assert_eq!(s.master(), MASTER, "not until the other replica follows");
        answer(&mut s, 400, REPLICA, Some(Role { replica_of: Some(OTHER), offset: 9 }));
        s.run_failover(500, &mut out);
        assert_eq!(s.master(), OTHER);
        assert_eq!(s.replicas, vec![MASTER, REPLICA], "the old master is a replica in this Sentinel's view");
    }

    /// The newest configuration decides who is deposed, whoever has not heard of it yet — including
    /// the leader's own, once it announces the promoted replica.
    #[test]
    fn the_newest_configuration_deposes_the_old_master() {
        let states: Vec<_> = (0..3).map(|i| Arc::new(Mutex::new(sentinel(i)))).collect();
        let sentinels = Sentinels(states.clone());
        assert!(!sentinels.deposed(MASTER) && sentinels.deposed(REPLICA), "before any failover");
        {
            let mut leader = states[1].lock().unwrap();
            leader.config_epoch = 1;
            leader.failover = Some(Failover::ReconfReplicas { promoted: REPLICA, since: 0 });
        }
        assert!(sentinels.deposed(MASTER), "the leader announces the promoted replica with epoch 1");
        assert!(!sentinels.deposed(REPLICA));
    }

    #[test]
    fn a_newer_configuration_from_a_peer_switches_the_master() {
        let mut s = sentinel(1);
        let mut out = Out::default();
        let hello = SentinelMsg::Hello { current_epoch: 3, master: REPLICA, config_epoch: 3 };
        s.apply(Now::at(0), S[0], RedisRequest::Sentinel(hello), &mut out);
        assert_eq!(s.master(), REPLICA);
        let stale = SentinelMsg::Hello { current_epoch: 3, master: MASTER, config_epoch: 2 };
        s.apply(Now::at(1), S[2], RedisRequest::Sentinel(stale), &mut out);
        assert_eq!(s.master(), REPLICA, "an older configuration changes nothing");
    }

    /// The old master, reachable again and still a master by its INFO, is converted once it has reported
    /// that role for 8 s and the new master looks sane.
    #[test]
    fn an_old_master_is_converted_after_eight_seconds() {
        let mut s = sentinel(1);
        let mut out = Out::default();
        let hello = SentinelMsg::Hello { current_epoch: 1, master: REPLICA, config_epoch: 1 };
        s.apply(Now::at(0), S[0], RedisRequest::Sentinel(hello), &mut out);
        let new_master = Some(Role { replica_of: None, offset: 9 });
        answer(&mut s, 100, REPLICA, new_master);
        assert!(answer(&mut s, 100, MASTER, AS_MASTER).is_empty(), "it has just reported the master role");
        answer(&mut s, 8_000, REPLICA, new_master);
        assert!(answer(&mut s, 8_050, MASTER, AS_MASTER).is_empty(), "7.95 s is not 8");
        answer(&mut s, 8_200, REPLICA, new_master);
        let convert = answer(&mut s, 8_200, MASTER, AS_MASTER);
        assert_eq!(convert, vec![(MASTER, RedisRequest::ReplicaOf { master: Some(REPLICA) })]);
    }

    /// A link whose PING has waited more than half `down-after` (and no PONG came for as long) is
    /// closed and dialled again once it is 15 s old; the instance is still down since its first
    /// unanswered PING, and the new connection is PINGed at the next timer.
    #[test]
    fn a_stuck_link_is_dialled_again_once_fifteen_seconds_old() {
        let mut s = sentinel(0);
        let mut out = Out::default();
        s.tick(Now::at(0), &mut out);
        let probes =
            sent(&mut out).into_iter().filter(|(_, m)| matches!(m, RedisRequest::Sentinel(SentinelMsg::Probe { .. })));
        assert_eq!(probes.map(|(to, _)| to).collect::<Vec<_>>(), vec![MASTER, REPLICA]);
        s.tick(Now::at(14_900), &mut out);
        assert!(out.reconnects.is_empty(), "not 15 s old yet");
        assert!(s.master_down(), "down since the PING at 0");
        sent(&mut out);
        s.tick(Now::at(15_100), &mut out);
        assert_eq!(out.reconnects, vec![MASTER, REPLICA]);
        assert!(s.master_down(), "still down since the PING at 0");
        out.reconnects.clear();
        let pings = tick(&mut s, 15_200);
        assert!(pings.contains(&(MASTER, RedisRequest::Sentinel(SentinelMsg::Probe { info: true }))), "{pings:?}");
        s.tick(Now::at(20_000), &mut out);
        assert!(out.reconnects.is_empty(), "the new link is young");
    }

    /// The timer's frequency is drawn at each run, 10 to 19 times a second.
    #[test]
    fn the_timer_runs_at_a_frequency_drawn_each_time() {
        let mut s = sentinel(0);
        s.restart(stream(7, Stream::Sentinel, 0), 0);
        let mut seen = std::collections::BTreeSet::new();
        for ms in (0..20_000).step_by(100) {
            tick(&mut s, ms);
            seen.insert(s.tick_interval().expect("a timer").as_millis());
        }
        assert!(seen.iter().all(|ms| (52..=100).contains(ms)), "{seen:?}");
        assert!(seen.len() > 5, "{seen:?}");
    }

    /// A replica that follows another master is pointed at this one once it has named that master for
    /// `failover-timeout` (60 s here): the clock restarts when it names yet another one.
    #[test]
    fn a_replica_of_another_master_is_fixed_once_its_configuration_settled() {
        const OTHER: NodeIx = NodeIx(3);
        const ANOTHER: NodeIx = NodeIx(4);
        let mut s = sentinel(0);
        tick(&mut s, 0);
        let fix = vec![(REPLICA, RedisRequest::ReplicaOf { master: Some(MASTER) })];
        let follows = |m: NodeIx| Some(Role { replica_of: Some(m), offset: 7 });
        let at = |s: &mut SentinelState, ms: i64, m: NodeIx| {
            answer(s, ms, MASTER, AS_MASTER);
            answer(s, ms, REPLICA, follows(m))
        };
        assert!(at(&mut s, 100, OTHER).is_empty());
        assert!(at(&mut s, 30_000, ANOTHER).is_empty(), "another master again, 30 s in: the clock restarts");
        assert!(at(&mut s, 60_050, ANOTHER).is_empty(), "60 s after the instance was made, 30 s after the change");
        assert!(at(&mut s, 90_000, ANOTHER).is_empty(), "exactly 60 s is not more than 60 s");
        assert_eq!(at(&mut s, 90_100, ANOTHER), fix);
    }
}
