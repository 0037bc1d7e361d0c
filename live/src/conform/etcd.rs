//! etcd: the simulated server (`locksim_sim::backend::etcd::EtcdState`, etcd 3.5) against `etcd` 3.4
//! from Debian 12, through its JSON gateway (`/v3/...`, the gRPC API as JSON over HTTP/1.1).
//!
//! Scripts use what the recipes use — put (with a lease), range (a key or a prefix, sorted, limited,
//! bounded by `max_create_revision`), delete, `Txn` comparing create/mod revision, version or value,
//! lease grant, keep-alive, revoke and time-to-live, and watches from a revision — from two or three
//! clients, with restarts (the data directory kept) and stops of the server between them. What 3.4 and
//! 3.5 share is all a script asks; where they differ the model follows 3.5 (docs/models.md, "How we
//! know the models are right").
//!
//! The real server keeps its revision across scripts, so a script's revisions are counted from where
//! the server stood at its start: the model's revision 1 is the real server's revision then. Leases are
//! named by the order they were granted in (`L0`, `L1`, …): the real server draws their ids at random.
//!
//! Lease expiry is checked every 500 ms by both, but the real lessor's ticks are not on the script's
//! grid: a script sends nothing from when a lease may expire until 700 ms after (its window), nor a
//! time-to-live on a whole second of remaining time.

use super::{ticks, Action, Answer, Family, ModelOf, Recover, Step, MARGIN_MS, SLOT_MS};
use crate::servers::{Addr, Launcher, Server};
use crate::wire::http;
use locksim_locks::etcd::gateway;
use locksim_sim::backend::etcd::{
    Cmp, Compare, EtcdError, EtcdReply, EtcdRequest, EtcdState, Event, EventType, KeyValue, Op as KvOp, OpResult,
    Range, SortOrder, SortTarget, Target, WatchResponse,
};
use locksim_sim::backend::{Now, Out};
use locksim_sim::history::NodeIx;
use locksim_sim::rng::{ChaCha8Rng, Rng};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A script step: a request with leases named by grant order and revisions counted from the script's
/// start.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Put {
        key: String,
        value: String,
        lease: Option<usize>,
    },
    Range(Range),
    Delete {
        key: String,
        prefix: bool,
    },
    /// One compare; on success a put, on failure a range of the compared key (the recipes' shape).
    Txn {
        compare: Compare,
        put: (String, String, Option<usize>),
    },
    Grant {
        ttl_s: i64,
    },
    KeepAlive {
        lease: usize,
    },
    Revoke {
        lease: usize,
    },
    TimeToLive {
        lease: usize,
    },
    /// Watch a key or prefix from a revision (0: from now on).
    Watch {
        key: String,
        prefix: bool,
        start_revision: i64,
    },
    /// The events the client's watch has delivered since it last asked.
    Events,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lease = |l: &Option<usize>| l.map_or(String::new(), |l| format!(" lease L{l}"));
        match self {
            Op::Put { key, value, lease: l } => write!(f, "put {key}={value}{}", lease(l)),
            Op::Range(r) => {
                write!(f, "range {}{}", r.key, if r.prefix { "*" } else { "" })?;
                if let Some((target, order)) = r.sort {
                    write!(f, " sort {target:?} {order:?}")?;
                }
                if r.limit > 0 {
                    write!(f, " limit {}", r.limit)?;
                }
                if r.max_create_revision > 0 {
                    write!(f, " max_create_revision {}", r.max_create_revision)?;
                }
                Ok(())
            }
            Op::Delete { key, prefix } => write!(f, "delete {key}{}", if *prefix { "*" } else { "" }),
            Op::Txn { compare, put: (key, value, l) } => {
                write!(
                    f,
                    "txn if {} {:?} {:?} then put {key}={value}{} else range {}",
                    compare.key,
                    compare.cmp,
                    compare.target,
                    lease(l),
                    compare.key
                )
            }
            Op::Grant { ttl_s } => write!(f, "lease grant ttl {ttl_s}"),
            Op::KeepAlive { lease } => write!(f, "lease keep-alive L{lease}"),
            Op::Revoke { lease } => write!(f, "lease revoke L{lease}"),
            Op::TimeToLive { lease } => write!(f, "lease time-to-live L{lease}"),
            Op::Watch { key, prefix, start_revision } => {
                write!(f, "watch {key}{} from revision {start_revision}", if *prefix { "*" } else { "" })
            }
            Op::Events => write!(f, "watch events"),
        }
    }
}

/// The etcd family, with the model it is checked against (a test swaps in a broken one).
pub struct Etcd {
    pub model: fn() -> Box<ModelOf<EtcdState>>,
}

impl Default for Etcd {
    fn default() -> Self {
        Etcd { model: || Box::new(EtcdState::default()) }
    }
}

impl Recover for EtcdState {
    fn recover(&mut self, now_ms: i64) {
        EtcdState::recover(self, now_ms)
    }
}

const KEYS: [&str; 5] = ["k0", "k1", "q/a", "q/b", "q/c"];
const VALUES: [&str; 3] = ["a", "b", "c"];
/// The lessor's period.
const EXPIRY_CHECK_MS: u64 = 500;
/// From when a lease may expire to when both servers have surely revoked it.
const EXPIRY_WINDOW_MS: u64 = EXPIRY_CHECK_MS + 200;

/// What the script generator knows of a lease.
struct LeaseClock {
    ttl_s: i64,
    /// When it may be revoked by expiry, as `(from, to)`; `None`: gone.
    window: Option<(u64, u64)>,
    /// When it expires, if that is known to the millisecond (not since a restart).
    expiry_ms: Option<u64>,
}

impl LeaseClock {
    /// Granted or renewed at `t`.
    fn renewed(&mut self, t: u64) {
        let e = t + self.ttl_s as u64 * 1000;
        self.window = Some((e - (SLOT_MS - MARGIN_MS / 2), e + EXPIRY_WINDOW_MS));
        self.expiry_ms = Some(e);
    }
}

/// How long a script leaves a restarting server before it speaks again.
const RESTART_GAP_MS: u64 = 30 * SLOT_MS;

/// The leases of a script over its time: what the generator draws by, and what a shrunk script is
/// checked against.
#[derive(Default)]
struct Leases(Vec<LeaseClock>);

impl Leases {
    /// The end of the expiry window `t` falls in, if any.
    fn hit(&self, t: u64) -> Option<u64> {
        self.0.iter().filter_map(|l| l.window).find(|(from, to)| (*from..=*to).contains(&t)).map(|(_, to)| to)
    }

    /// Forget the leases whose window has passed without a renewal: both servers have revoked them.
    fn expire(&mut self, t: u64) {
        for l in &mut self.0 {
            if l.window.is_some_and(|(_, to)| to < t) {
                (l.window, l.expiry_ms) = (None, None);
            }
        }
    }

    /// A restart at `t` renews every lease, plus the election timeout, from when the server leads
    /// again: at the restart for the model, some time before the script speaks again for the real one.
    fn restarted(&mut self, t: u64) {
        for l in &mut self.0 {
            if let Some(window) = &mut l.window {
                let due = 1000 + l.ttl_s as u64 * 1000;
                *window = (t + due - SLOT_MS, t + RESTART_GAP_MS + due + EXPIRY_WINDOW_MS);
                l.expiry_ms = None;
            }
        }
    }

    /// A lease due while the server is stopped (until `until`) is revoked once it continues.
    fn stopped(&mut self, until: u64) {
        for window in self.0.iter_mut().filter_map(|l| l.window.as_mut()) {
            if window.0 < until {
                window.1 = window.1.max(until + EXPIRY_WINDOW_MS);
            }
        }
    }

    /// Whether a time-to-live of `lease` at `t` can be compared: a remaining time of whole seconds
    /// reads either side of a second, and one not known to the millisecond is not compared.
    fn comparable(&self, lease: usize, t: u64) -> bool {
        self.0
            .get(lease)
            .is_none_or(|l| l.window.is_none() || l.expiry_ms.is_some_and(|e| e.saturating_sub(t) % 1000 != 0))
    }

    /// `op` is sent at `t`.
    fn sent(&mut self, op: &Op, t: u64) {
        match op {
            Op::Grant { ttl_s } => {
                let mut l = LeaseClock { ttl_s: (*ttl_s).max(2), window: None, expiry_ms: None };
                l.renewed(t);
                self.0.push(l);
            }
            Op::KeepAlive { lease } => {
                if let Some(l) = self.0.get_mut(*lease).filter(|l| l.window.is_some()) {
                    l.renewed(t);
                }
            }
            Op::Revoke { lease } => {
                if let Some(l) = self.0.get_mut(*lease) {
                    (l.window, l.expiry_ms) = (None, None);
                }
            }
            _ => {}
        }
    }
}

fn pick<'a>(rng: &mut ChaCha8Rng, from: &[&'a str]) -> &'a str {
    from[rng.gen_range(0..from.len())]
}

/// A draw from the request kinds, given the leases granted so far and the revision reached.
fn request(rng: &mut ChaCha8Rng, leases: &[LeaseClock], revision: i64, watching: bool) -> Op {
    let key = pick(rng, &KEYS).to_string();
    let value = pick(rng, &VALUES).to_string();
    let lease =
        |rng: &mut ChaCha8Rng| (!leases.is_empty() && rng.gen_bool(0.5)).then(|| rng.gen_range(0..leases.len()));
    let some_lease = |rng: &mut ChaCha8Rng| rng.gen_range(0..leases.len().max(1));
    let revision_near = |rng: &mut ChaCha8Rng| rng.gen_range(1..=revision.max(1) + 1);
    match rng.gen_range(0..24) {
        0..=3 => Op::Put { key, value, lease: lease(rng) },
        4..=7 => {
            let prefix = rng.gen_bool(0.6);
            let key = if prefix { "q/".to_string() } else { key };
            let targets = [SortTarget::Key, SortTarget::Create, SortTarget::Mod];
            let sort = (prefix && rng.gen_bool(0.7)).then(|| {
                let order = if rng.gen_bool(0.5) { SortOrder::Ascend } else { SortOrder::Descend };
                (targets[rng.gen_range(0..3)], order)
            });
            let limit = if prefix && rng.gen_bool(0.5) { 1 } else { 0 };
            let max_create_revision = if prefix && rng.gen_bool(0.3) { revision_near(rng) } else { 0 };
            Op::Range(Range { key, prefix, sort, limit, max_create_revision })
        }
        8 | 9 => {
            let prefix = rng.gen_bool(0.2);
            Op::Delete { key: if prefix { "q/".into() } else { key }, prefix }
        }
        10..=13 => {
            let (cmp, target) = match rng.gen_range(0..5) {
                0 => (Cmp::Equal, Target::CreateRevision(0)),
                1 => (Cmp::Less, Target::CreateRevision(revision_near(rng))),
                2 => (Cmp::Equal, Target::ModRevision(revision_near(rng))),
                3 => (Cmp::Greater, Target::Version(rng.gen_range(0..3))),
                _ => (Cmp::Equal, Target::Value(pick(rng, &VALUES).to_string())),
            };
            Op::Txn { compare: Compare { key: key.clone(), cmp, target }, put: (key, value, lease(rng)) }
        }
        14 | 15 => Op::Grant { ttl_s: rng.gen_range(1..=4) },
        16 | 17 if !leases.is_empty() => Op::KeepAlive { lease: some_lease(rng) },
        18 if !leases.is_empty() => Op::Revoke { lease: some_lease(rng) },
        19 if !leases.is_empty() => Op::TimeToLive { lease: some_lease(rng) },
        20 | 21 if !watching => {
            let prefix = rng.gen_bool(0.5);
            let key = if prefix { "q/".to_string() } else { key };
            let start_revision = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(2..=revision.max(2) + 1) };
            Op::Watch { key, prefix, start_revision }
        }
        22 | 23 if watching => Op::Events,
        _ => Op::Range(Range::key(&key)),
    }
}

impl Family for Etcd {
    const NAME: &'static str = "etcd";
    const ABOUT: &'static str = "etcd 3.4 (Debian's `etcd-server`) against the 3.5 model, through its JSON gateway.";
    type Op = Op;
    type Conn = Client;
    type Shared = Run;

    fn server() -> &'static Launcher {
        &crate::servers::ETCD
    }

    fn script(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        let clients = rng.gen_range(2..=3);
        let mut steps = Vec::new();
        let mut leases = Leases::default();
        let mut watching = vec![false; clients];
        // An upper bound on the revision reached (every step a write), for drawing revisions.
        let mut revision = 1;
        let mut t = 0;
        for _ in 0..rng.gen_range(12..=30) {
            t += SLOT_MS * rng.gen_range(1..=3);
            while let Some(end) = leases.hit(t) {
                t = (end + SLOT_MS).next_multiple_of(SLOT_MS);
            }
            leases.expire(t);
            match rng.gen_range(0..30) {
                0 => {
                    steps.push(Step { at_ms: t, action: Action::Restart { keep: true } });
                    watching.iter_mut().for_each(|w| *w = false);
                    leases.restarted(t);
                    t += RESTART_GAP_MS;
                }
                1 => {
                    let ms = SLOT_MS * rng.gen_range(2..=8);
                    steps.push(Step { at_ms: t, action: Action::Stop { ms } });
                    t += ms;
                    leases.stopped(t);
                }
                _ => {
                    let client = rng.gen_range(0..clients);
                    let mut op = request(rng, &leases.0, revision, watching[client]);
                    if matches!(op, Op::TimeToLive { lease } if !leases.comparable(lease, t)) {
                        op = Op::Range(Range::key("k0"));
                    }
                    leases.sent(&op, t);
                    watching[client] |= matches!(op, Op::Watch { .. });
                    revision += 1;
                    steps.push(Step { at_ms: t, action: Action::Client { client, op } });
                }
            }
        }
        steps
    }

    fn kind(op: &Op) -> &'static str {
        match op {
            Op::Put { lease: Some(_), .. } => "put with lease",
            Op::Put { .. } => "put",
            Op::Range(r) if r.max_create_revision > 0 => "range max_create_revision",
            Op::Range(r) if r.sort.is_some() => "range sorted",
            Op::Range(r) if r.prefix => "range prefix",
            Op::Range(_) => "range",
            Op::Delete { .. } => "delete",
            Op::Txn { compare, .. } => match compare.target {
                Target::CreateRevision(_) => "txn create_revision",
                Target::ModRevision(_) => "txn mod_revision",
                Target::Version(_) => "txn version",
                Target::Value(_) => "txn value",
            },
            Op::Grant { .. } => "lease grant",
            Op::KeepAlive { .. } => "lease keep-alive",
            Op::Revoke { .. } => "lease revoke",
            Op::TimeToLive { .. } => "lease time-to-live",
            Op::Watch { start_revision: 0, .. } => "watch",
            Op::Watch { .. } => "watch from revision",
            Op::Events => "watch events",
        }
    }

    fn model(&self, steps: &[Step<Op>]) -> Vec<Answer> {
        let mut server = (self.model)();
        let mut ids: Vec<i64> = Vec::new();
        let mut delivered: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        let mut out = Out::default();
        let mut stop = (0, 0);
        let mut next_tick = EXPIRY_CHECK_MS;
        let mut answers = Vec::new();
        for s in steps {
            match &s.action {
                Action::Stop { ms } => stop = (s.at_ms, s.at_ms + ms),
                Action::Restart { .. } => {
                    next_tick = ticks(EXPIRY_CHECK_MS, next_tick, stop, s.at_ms, |at| {
                        server.tick(Now::at(at as i64), &mut out)
                    });
                    server.recover(s.at_ms as i64);
                }
                Action::Client { client, op } => {
                    let at = if (stop.0..stop.1).contains(&s.at_ms) { stop.1 } else { s.at_ms };
                    next_tick =
                        ticks(EXPIRY_CHECK_MS, next_tick, stop, at, |t| server.tick(Now::at(t as i64), &mut out));
                    collect(&mut out, &ids, &mut delivered);
                    let text = match op {
                        Op::Events => delivered.remove(client).unwrap_or_default().join(" | "),
                        _ => {
                            let request = to_model(op, &ids, *client);
                            let reply = server.apply(Now::at(at as i64), NodeIx(*client as u32), request, &mut out);
                            if let EtcdReply::LeaseGranted { id, .. } = reply {
                                ids.push(id);
                            }
                            show(&reply, &|id| ids.iter().position(|i| *i == id))
                        }
                    };
                    collect(&mut out, &ids, &mut delivered);
                    answers.push(Answer { text, at_ms: at });
                }
            }
        }
        answers
    }

    fn reset(server: &Server) -> anyhow::Result<Run> {
        let addr = server.addr().0;
        // Revoke what earlier scripts left, and delete every key.
        let leases: Value = serde_json::from_str(&http::post(addr, "/v3/lease/leases", "{}")?)?;
        for l in leases["leases"].as_array().into_iter().flatten() {
            let _ = http::post(addr, "/v3/lease/revoke", &json!({"ID": l["ID"]}).to_string());
        }
        let everything = json!({"key": gateway::b64("\0"), "range_end": gateway::b64("\0")});
        http::post(addr, "/v3/kv/deleterange", &everything.to_string())?;
        let answer = http::post(addr, "/v3/kv/range", &gateway::range(&Range::key("k0")).to_string())?;
        // The model starts at revision 1.
        Ok(Run { offset: gateway::revision(&serde_json::from_str(&answer)?) - 1, leases: Mutex::new(Vec::new()) })
    }

    fn connect(addr: &Addr, run: &Arc<Run>, _: usize) -> anyhow::Result<Client> {
        Ok(Client { addr: *addr, run: run.clone(), watch: None })
    }

    fn send(client: &mut Client, op: &Op) -> anyhow::Result<String> {
        client.send(op)
    }

    fn reconnect(_client: &mut Client) {}

    /// Nothing is sent where a lease may be expiring, no time-to-live is asked where it cannot be
    /// compared, and a client watches once per life of the server (the real client keeps one stream).
    fn valid(steps: &[Step<Op>]) -> bool {
        let mut leases = Leases::default();
        let mut watching = std::collections::BTreeSet::new();
        steps.iter().all(|s| {
            if leases.hit(s.at_ms).is_some() {
                return false;
            }
            leases.expire(s.at_ms);
            match &s.action {
                Action::Restart { .. } => {
                    watching.clear();
                    leases.restarted(s.at_ms);
                }
                Action::Stop { ms } => leases.stopped(s.at_ms + ms),
                Action::Client { client, op } => {
                    let fine = match op {
                        Op::Watch { .. } => watching.insert(*client),
                        Op::TimeToLive { lease } => leases.comparable(*lease, s.at_ms),
                        _ => true,
                    };
                    if !fine {
                        return false;
                    }
                    leases.sent(op, s.at_ms);
                }
            }
            true
        })
    }
}

/// Pushed watch events, as text, per client.
fn collect(out: &mut Out, ids: &[i64], delivered: &mut BTreeMap<usize, Vec<String>>) {
    out.events.clear();
    for (node, push) in out.pushes.drain(..) {
        if let Ok(response) = push.downcast::<WatchResponse>() {
            let lease = |id| ids.iter().position(|i| *i == id);
            let list = delivered.entry(node.0 as usize).or_default();
            list.extend(response.events.iter().map(|e| show_event(e, &lease)));
        }
    }
}

/// The request a step stands for, in the model's lease ids.
fn to_model(op: &Op, ids: &[i64], client: usize) -> EtcdRequest {
    let lease = |l: &Option<usize>| l.map_or(0, |l| ids.get(l).copied().unwrap_or(-1));
    let id = |l: &usize| ids.get(*l).copied().unwrap_or(-1);
    match op {
        Op::Put { key, value, lease: l } => {
            EtcdRequest::Op(KvOp::Put { key: key.clone(), value: value.clone(), lease: lease(l) })
        }
        Op::Range(r) => EtcdRequest::Op(KvOp::Range(r.clone())),
        Op::Delete { key, prefix } => EtcdRequest::Op(KvOp::Delete { key: key.clone(), prefix: *prefix }),
        Op::Txn { compare, put: (key, value, l) } => EtcdRequest::Txn {
            compare: vec![compare.clone()],
            success: vec![KvOp::Put { key: key.clone(), value: value.clone(), lease: lease(l) }],
            failure: vec![KvOp::Range(Range::key(&compare.key))],
        },
        Op::Grant { ttl_s } => EtcdRequest::LeaseGrant { ttl_s: *ttl_s },
        Op::KeepAlive { lease } => EtcdRequest::LeaseKeepAlive { id: id(lease) },
        Op::Revoke { lease } => EtcdRequest::LeaseRevoke { id: id(lease) },
        Op::TimeToLive { lease } => EtcdRequest::LeaseTimeToLive { id: id(lease) },
        Op::Watch { key, prefix, start_revision } => EtcdRequest::Watch {
            id: client as u64,
            connection: 0,
            key: key.clone(),
            prefix: *prefix,
            start_revision: *start_revision,
        },
        Op::Events => unreachable!("answered from the delivered events"),
    }
}

fn show_kv(kv: &KeyValue, lease: &dyn Fn(i64) -> Option<usize>) -> String {
    let l = if kv.lease == 0 {
        String::new()
    } else {
        lease(kv.lease).map_or(" lease ?".into(), |l| format!(" lease L{l}"))
    };
    format!("{}={} c{} m{} v{}{l}", kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)
}

fn show_event(e: &Event, lease: &dyn Fn(i64) -> Option<usize>) -> String {
    match e.kind {
        EventType::Put => format!("PUT {}", show_kv(&e.kv, lease)),
        EventType::Delete => format!("DELETE {} m{}", e.kv.key, e.kv.mod_revision),
    }
}

fn show_result(r: &OpResult, lease: &dyn Fn(i64) -> Option<usize>) -> String {
    match r {
        OpResult::Range { kvs, count } => {
            let kvs: Vec<String> = kvs.iter().map(|kv| show_kv(kv, lease)).collect();
            format!("count {count} [{}]", kvs.join(", "))
        }
        OpResult::Put => "put".into(),
        OpResult::Delete { deleted } => format!("deleted {deleted}"),
    }
}

/// An answer as text, leases by grant order.
fn show(reply: &EtcdReply, lease: &dyn Fn(i64) -> Option<usize>) -> String {
    let name = |id| lease(id).map_or("L?".into(), |l| format!("L{l}"));
    match reply {
        EtcdReply::Op { revision, result } => format!("rev {revision} {}", show_result(result, lease)),
        EtcdReply::Txn { revision, succeeded, results } => {
            let results: Vec<String> = results.iter().map(|r| show_result(r, lease)).collect();
            format!("rev {revision} {} {}", if *succeeded { "succeeded" } else { "failed" }, results.join("; "))
        }
        EtcdReply::LeaseGranted { id, ttl_s } => format!("{} ttl {ttl_s}", name(*id)),
        EtcdReply::KeepAlive { ttl_s, .. } => format!("ttl {ttl_s}"),
        EtcdReply::LeaseRevoked { revision } => format!("revoked, rev {revision}"),
        EtcdReply::TimeToLive { ttl_s: -1, .. } => "gone".into(),
        EtcdReply::TimeToLive { ttl_s, granted_ttl_s, .. } => format!("ttl {ttl_s} of {granted_ttl_s}"),
        EtcdReply::WatchCreated { .. } => "created".into(),
        EtcdReply::WatchCanceled => "canceled".into(),
        EtcdReply::Error(EtcdError::LeaseNotFound) => "error lease not found".into(),
        EtcdReply::Error(EtcdError::ProposalDropped) => "error proposal dropped".into(),
    }
}

/// What the clients of one real run share: where the script's revisions start, and the leases.
pub struct Run {
    /// Real revision = script revision + offset.
    offset: i64,
    /// The real ids of the leases granted so far, in grant order.
    leases: Mutex<Vec<i64>>,
}

/// One client of the real server: requests by the gateway, and its watch's stream.
pub struct Client {
    addr: Addr,
    run: Arc<Run>,
    watch: Option<Watch>,
}

/// A watch stream, read by its own thread into `events`; dropping it closes the stream.
struct Watch {
    events: Arc<Mutex<Vec<String>>>,
    _closer: http::Closer,
}

/// A script's request with the real server's revisions (the script's counted from its start).
fn to_real(request: EtcdRequest, offset: i64) -> EtcdRequest {
    let shift = |r: i64| if r > 0 { r + offset } else { r };
    let range = |r: Range| Range { max_create_revision: shift(r.max_create_revision), ..r };
    let op = |op: KvOp| match op {
        KvOp::Range(r) => KvOp::Range(range(r)),
        other => other,
    };
    match request {
        EtcdRequest::Op(o) => EtcdRequest::Op(op(o)),
        EtcdRequest::Txn { compare, success, failure } => EtcdRequest::Txn {
            compare: compare
                .into_iter()
                .map(|c| Compare {
                    target: match c.target {
                        Target::CreateRevision(r) => Target::CreateRevision(shift(r)),
                        Target::ModRevision(r) => Target::ModRevision(shift(r)),
                        other => other,
                    },
                    ..c
                })
                .collect(),
            success: success.into_iter().map(op).collect(),
            failure: failure.into_iter().map(op).collect(),
        },
        other => other,
    }
}

/// A key as the script sees it: revisions counted from the script's start.
fn kv_from_real(kv: KeyValue, offset: i64) -> KeyValue {
    let shift = |r: i64| if r == 0 { 0 } else { r - offset };
    KeyValue { create_revision: shift(kv.create_revision), mod_revision: shift(kv.mod_revision), ..kv }
}

/// The real server's answer with the script's revisions.
fn from_real(reply: EtcdReply, offset: i64) -> EtcdReply {
    let result = |r: OpResult| match r {
        OpResult::Range { kvs, count } => {
            OpResult::Range { kvs: kvs.into_iter().map(|kv| kv_from_real(kv, offset)).collect(), count }
        }
        other => other,
    };
    match reply {
        EtcdReply::Op { revision, result: r } => EtcdReply::Op { revision: revision - offset, result: result(r) },
        EtcdReply::Txn { revision, succeeded, results } => EtcdReply::Txn {
            revision: revision - offset,
            succeeded,
            results: results.into_iter().map(result).collect(),
        },
        EtcdReply::LeaseRevoked { revision } => EtcdReply::LeaseRevoked { revision: revision - offset },
        other => other,
    }
}

impl Client {
    /// A unary request by the gateway; an error saying the lease is unknown is that etcd error.
    fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        match http::post(self.addr.0, path, &body.to_string()) {
            Ok(text) => Ok(serde_json::from_str(&text)?),
            Err(http::Error::Status { body, .. }) if gateway::lease_not_found(&body) => {
                Ok(json!({"error": "lease not found"}))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn lease_name(&self) -> impl Fn(i64) -> Option<usize> + '_ {
        |id| self.run.leases.lock().expect("leases lock").iter().position(|i| *i == id)
    }

    fn send(&mut self, op: &Op) -> anyhow::Result<String> {
        match op {
            Op::Events => {
                let events = self.watch.as_ref().map(|w| std::mem::take(&mut *w.events.lock().expect("events lock")));
                return Ok(events.unwrap_or_default().join(" | "));
            }
            Op::Watch { key, prefix, start_revision } => return self.watch(key, *prefix, *start_revision),
            _ => {}
        }
        let ids = self.run.leases.lock().expect("leases lock").clone();
        let request = to_real(to_model(op, &ids, 0), self.run.offset);
        let (path, body) = gateway::encode(&request).expect("a unary request");
        let reply = gateway::decode(&request, &self.post(path, body)?);
        if let EtcdReply::LeaseGranted { id, .. } = reply {
            self.run.leases.lock().expect("leases lock").push(id);
        }
        Ok(show(&from_real(reply, self.run.offset), &self.lease_name()))
    }

    /// Open the client's watch stream; answered once the server says it is created.
    fn watch(&mut self, key: &str, prefix: bool, start_revision: i64) -> anyhow::Result<String> {
        let start = if start_revision > 0 { start_revision + self.run.offset } else { 0 };
        let create = gateway::watch_create(key, prefix, start);
        let (closer, mut lines) = http::open(self.addr.0, "/v3/watch", &create.to_string())?;
        let created: Value = serde_json::from_str(&lines.next_line()?.unwrap_or_default())?;
        // What the previous stream (ended by a restart) delivered and nobody asked for yet.
        let undrained = self.watch.take().map(|w| std::mem::take(&mut *w.events.lock().expect("events lock")));
        let events = Arc::new(Mutex::new(undrained.unwrap_or_default()));
        let (sink, run) = (events.clone(), self.run.clone());
        // The first message may already carry events (a watch from a past revision).
        let mut pending = vec![created];
        std::thread::spawn(move || {
            let name = |id| run.leases.lock().expect("leases lock").iter().position(|i| *i == id);
            loop {
                for message in pending.drain(..) {
                    for e in gateway::watch_message(&message).1 {
                        let event = Event { kv: kv_from_real(e.kv, run.offset), ..e };
                        sink.lock().expect("events lock").push(show_event(&event, &name));
                    }
                }
                match lines.next_line() {
                    Ok(Some(line)) => pending.extend(serde_json::from_str::<Value>(&line).ok()),
                    _ => return,
                }
            }
        });
        self.watch = Some(Watch { events, _closer: closer });
        Ok("created".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::{coverage, script};

    #[test]
    fn scripts_keep_their_rules_and_play_every_kind() {
        let mut counts = BTreeMap::new();
        for seed in 0..300 {
            let steps = script::<Etcd>(seed);
            assert!(Etcd::valid(&steps), "seed {seed}: one watch per client per server life");
            assert!(steps.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "seed {seed}: one step at a time");
            assert!(steps.iter().all(|s| s.at_ms % SLOT_MS == 0), "seed {seed}: on the grid");
            coverage::<Etcd>(&steps, &mut counts);
        }
        for kind in [
            "put",
            "put with lease",
            "range",
            "range prefix",
            "range sorted",
            "range max_create_revision",
            "delete",
            "txn create_revision",
            "txn mod_revision",
            "txn version",
            "txn value",
            "lease grant",
            "lease keep-alive",
            "lease revoke",
            "lease time-to-live",
            "watch",
            "watch from revision",
            "watch events",
            "stop",
            "restart (data kept)",
        ] {
            assert!(counts.get(kind).copied().unwrap_or(0) >= 5, "{kind}: {counts:?}");
        }
    }

    #[test]
    fn the_model_revokes_an_expired_lease_and_tells_the_watcher() {
        let steps = vec![
            Step {
                at_ms: 0,
                action: Action::Client {
                    client: 0,
                    op: Op::Watch { key: "q/".into(), prefix: true, start_revision: 0 },
                },
            },
            Step { at_ms: 100, action: Action::Client { client: 1, op: Op::Grant { ttl_s: 1 } } },
            Step {
                at_ms: 200,
                action: Action::Client {
                    client: 1,
                    op: Op::Put { key: "q/a".into(), value: "a".into(), lease: Some(0) },
                },
            },
            Step { at_ms: 3000, action: Action::Client { client: 0, op: Op::Events } },
            Step { at_ms: 3100, action: Action::Client { client: 1, op: Op::TimeToLive { lease: 0 } } },
        ];
        let answers: Vec<String> = Etcd::default().model(&steps).into_iter().map(|a| a.text).collect();
        // Granted 2 s (the minimum) at 100 ms, revoked by the lessor's tick at 2500 ms.
        assert_eq!(
            answers,
            ["created", "L0 ttl 2", "rev 2 put", "PUT q/a=a c2 m2 v1 lease L0 | DELETE q/a m3", "gone"]
        );
    }
}
