//! ZooKeeper: the simulated server (`locksim_sim::backend::zk::ZkState`) against ZooKeeper 3.8 from
//! Debian 12, on its wire protocol (`jute`), tickTime 200 ms.
//!
//! Scripts use what the recipes use — create (persistent, ephemeral, sequential, with parents), delete
//! with a version (and "delete the first child", as a lock's release does), `exists`/`getData`/
//! `getChildren` with and without watches, `setData` with a version, `removeWatches`, pings, session
//! close and session expiry — from two or three clients, each with its own session, with restarts and
//! stops of the server between them.
//!
//! What is normalised: zxids are shown by rank (the order they first appear in a script's answers: the
//! model does not count session transactions, and a restarted real server starts a new epoch), an
//! ephemeral owner by the client whose session it is, and children sorted. A session expires on the
//! server's own tick, which is not on the script's grid, so nothing is sent from a session's timeout
//! until a tick and a slot after it.

use super::{ticks, Action, Answer, Family, ModelOf, Recover, Step, SLOT_MS};
use crate::servers::{Addr, Launcher, Server};
use crate::wire::jute::{self, Body};
use locksim_sim::backend::zk::{CreateMode, Stat, TxnOp, WatchEvent, ZkError, ZkOp, ZkReply, ZkRequest, ZkState};
use locksim_sim::backend::{Now, Out};
use locksim_sim::history::NodeIx;
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::servers::ZK_TICK_MS as TICK_MS;

/// How long the script leaves a restarting server before it speaks again (a JVM start).
const RESTART_GAP_MS: u64 = 2500;

/// A script step: a request of the client's session as the model names it, or one of the client-side
/// steps recipes take (open a session, create with parents, release the first child, read the events).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Open a new session asking for `timeout_ms`.
    Connect {
        timeout_ms: i64,
    },
    Request(ZkOp),
    /// Curator's `creatingParentsIfNeeded`: each missing ancestor (persistent), then the node.
    CreateWithParents {
        path: String,
        data: String,
        mode: CreateMode,
    },
    /// `getChildren(parent)`, then delete the first child in name order (a lock's release).
    DeleteFirstChild {
        parent: String,
    },
    /// A ping, then the watch events delivered since the client last asked.
    Events,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = |watch: &bool| if *watch { " watch" } else { "" };
        match self {
            Op::Connect { timeout_ms } => write!(f, "connect, timeout {timeout_ms} ms"),
            Op::CreateWithParents { path, data, mode } => write!(f, "create {path} {data:?} {mode:?} with parents"),
            Op::DeleteFirstChild { parent } => write!(f, "delete the first child of {parent}"),
            Op::Events => write!(f, "watch events"),
            Op::Request(op) => match op {
                ZkOp::Create { path, data, mode } => write!(f, "create {path} {data:?} {mode:?}"),
                ZkOp::Delete { path, version } => write!(f, "delete {path} version {version}"),
                ZkOp::SetData { path, data, version } => write!(f, "setData {path} {data:?} version {version}"),
                ZkOp::Exists { path, watch } => write!(f, "exists {path}{}", w(watch)),
                ZkOp::GetData { path, watch } => write!(f, "getData {path}{}", w(watch)),
                ZkOp::GetChildren { path, watch } => write!(f, "getChildren {path}{}", w(watch)),
                ZkOp::RemoveWatches { path } => write!(f, "removeWatches {path}"),
                ZkOp::Multi(ops) => {
                    let ops: Vec<String> = ops.iter().map(show_txn_op).collect();
                    write!(f, "multi [{}]", ops.join("; "))
                }
                ZkOp::Sync { path } => write!(f, "sync {path}"),
                ZkOp::Ping => write!(f, "ping"),
                ZkOp::Close => write!(f, "close session"),
            },
        }
    }
}

fn show_txn_op(op: &TxnOp) -> String {
    match op {
        TxnOp::Create { path, data, mode } => format!("create {path} {data:?} {mode:?}"),
        TxnOp::Delete { path, version } => format!("delete {path} version {version}"),
        TxnOp::SetData { path, data, version } => format!("setData {path} {data:?} version {version}"),
        TxnOp::Check { path, version } => format!("check {path} version {version}"),
    }
}

/// The ZooKeeper family, with the model it is checked against (a test swaps in a broken one).
pub struct Zk {
    pub model: fn() -> Box<ModelOf<ZkState>>,
}

impl Default for Zk {
    fn default() -> Self {
        Zk { model: || Box::new(ZkState::new(Duration::from_millis(TICK_MS))) }
    }
}

impl Recover for ZkState {
    fn recover(&mut self, now_ms: i64) {
        ZkState::recover(self, now_ms)
    }
}

const PATHS: [&str; 4] = ["/s", "/s/a", "/s/b", "/s/a/x"];
const QUEUE: &str = "/s/q";
const DATA: [&str; 3] = ["", "d1", "d2"];

/// A client's session, as a script knows it.
#[derive(Clone, Copy)]
enum Session {
    None,
    /// Last heard at `last`, with timeout `timeout`; `slack`: how much later the real server may have
    /// renewed it (it reloads its sessions some time after a restart).
    Live {
        last: u64,
        timeout: u64,
        slack: u64,
    },
}

impl Session {
    /// From when the server may expire it until a tick and a slot after the latest it could.
    fn window(self) -> Option<(u64, u64)> {
        match self {
            Session::Live { last, timeout, slack } => {
                Some((last + timeout - SLOT_MS, last + slack + timeout + TICK_MS + 2 * SLOT_MS))
            }
            Session::None => None,
        }
    }
}

/// The sessions of a script's clients over its time: what the generator draws by, and what a shrunk
/// script is checked against.
struct Sessions(Vec<Session>);

impl Sessions {
    /// The end of the expiry window `t` falls in, if any.
    fn hit(&self, t: u64) -> Option<u64> {
        self.0.iter().filter_map(|s| s.window()).find(|(a, b)| (*a..=*b).contains(&t)).map(|(_, b)| b)
    }

    /// Forget the sessions whose window has passed: the server has expired them.
    fn expire(&mut self, t: u64) {
        for s in &mut self.0 {
            if s.window().is_some_and(|(_, to)| to < t) {
                *s = Session::None;
            }
        }
    }

    /// Whether the server may stop from `t` for `ms` without a session coming near its expiry.
    fn may_stop(&self, t: u64, ms: u64) -> bool {
        self.0.iter().filter_map(|s| s.window()).all(|(from, _)| from > t + ms + SLOT_MS)
    }

    /// Client `client` sends `op` at `t`.
    fn sent(&mut self, client: usize, op: &Op, t: u64) {
        let s = &mut self.0[client];
        *s = match (op, *s) {
            (Op::Request(ZkOp::Close), _) => Session::None,
            (Op::Connect { timeout_ms }, _) => Session::Live { last: t, timeout: *timeout_ms as u64, slack: 0 },
            (_, Session::Live { timeout, .. }) => Session::Live { last: t, timeout, slack: 0 },
            (_, Session::None) => Session::None,
        };
    }

    /// The server restarts at `t`: the model renews every session then, the real server on loading.
    fn restarted(&mut self, t: u64) {
        for s in &mut self.0 {
            if let Session::Live { last, slack, .. } = s {
                (*last, *slack) = (t, RESTART_GAP_MS);
            }
        }
    }
}

fn op(rng: &mut ChaCha8Rng) -> Op {
    let path = PATHS[rng.gen_range(0..PATHS.len())].to_string();
    let data = DATA[rng.gen_range(0..DATA.len())].to_string();
    let watch = rng.gen_bool(0.5);
    let version = rng.gen_range(-1..=2);
    Op::Request(match rng.gen_range(0..29) {
        0..=5 => {
            let parents = path == "/s/a/x" && rng.gen_bool(0.5);
            let mode = [CreateMode::Persistent, CreateMode::Ephemeral][rng.gen_range(0..2)];
            if parents {
                return Op::CreateWithParents { path, data, mode };
            }
            ZkOp::Create { path, data, mode }
        }
        6..=8 => {
            let parents = rng.gen_bool(0.5);
            let mode = [CreateMode::PersistentSequential, CreateMode::EphemeralSequential][rng.gen_range(0..2)];
            let path = format!("{QUEUE}/n-");
            if parents {
                return Op::CreateWithParents { path, data, mode };
            }
            ZkOp::Create { path, data, mode }
        }
        9 | 10 => ZkOp::Delete { path, version },
        11 => return Op::DeleteFirstChild { parent: QUEUE.into() },
        12 | 13 => ZkOp::SetData { path, data, version },
        14 | 15 => ZkOp::Exists { path, watch },
        16 | 17 => ZkOp::GetData { path, watch },
        18 | 19 => ZkOp::GetChildren { path: if rng.gen_bool(0.5) { QUEUE.into() } else { path }, watch },
        20 => ZkOp::RemoveWatches { path },
        21 => ZkOp::Ping,
        22..=24 => return Op::Events,
        25 | 26 => ZkOp::Multi((0..rng.gen_range(1..=3)).map(|_| txn_op(rng)).collect()),
        27 => ZkOp::Sync { path },
        _ => ZkOp::Close,
    })
}

/// One operation of a `multi`: the lock recipes' writes and a version check.
fn txn_op(rng: &mut ChaCha8Rng) -> TxnOp {
    let path = PATHS[rng.gen_range(0..PATHS.len())].to_string();
    let data = DATA[rng.gen_range(0..DATA.len())].to_string();
    let version = rng.gen_range(-1..=2);
    match rng.gen_range(0..5) {
        0 => TxnOp::Create { path, data, mode: [CreateMode::Persistent, CreateMode::Ephemeral][rng.gen_range(0..2)] },
        1 => TxnOp::Create { path: format!("{QUEUE}/n-"), data, mode: CreateMode::EphemeralSequential },
        2 => TxnOp::Delete { path, version },
        3 => TxnOp::SetData { path, data, version },
        _ => TxnOp::Check { path, version },
    }
}

impl Family for Zk {
    const NAME: &'static str = "zk";
    const ABOUT: &'static str = "ZooKeeper 3.8 (Debian's `zookeeper`), on its wire protocol.";
    type Op = Op;
    type Conn = Client;
    type Shared = Run;

    fn server() -> &'static Launcher {
        &crate::servers::ZOOKEEPER
    }

    fn script(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        let clients = rng.gen_range(2..=3);
        let mut sessions = Sessions(vec![Session::None; clients]);
        let mut steps = Vec::new();
        let mut t = 0;
        for _ in 0..rng.gen_range(15..=35) {
            t += SLOT_MS * rng.gen_range(1..=3);
            while let Some(end) = sessions.hit(t) {
                t = (end + SLOT_MS).next_multiple_of(SLOT_MS);
            }
            sessions.expire(t);
            match rng.gen_range(0..40) {
                0 => {
                    // Every live session is heard from right after `back`, before either server could
                    // expire it (timeouts are at least 3 s).
                    steps.push(Step { at_ms: t, action: Action::Restart { keep: true } });
                    sessions.restarted(t);
                    t += RESTART_GAP_MS;
                    for client in 0..clients {
                        if let Session::Live { .. } = sessions.0[client] {
                            let ping = Op::Request(ZkOp::Ping);
                            sessions.sent(client, &ping, t);
                            steps.push(Step { at_ms: t, action: Action::Client { client, op: ping } });
                            t += SLOT_MS;
                        }
                    }
                }
                1 => {
                    let ms = SLOT_MS * rng.gen_range(2..=6);
                    if sessions.may_stop(t, ms) {
                        steps.push(Step { at_ms: t, action: Action::Stop { ms } });
                        t += ms;
                    }
                }
                _ => {
                    let client = rng.gen_range(0..clients);
                    let op = match sessions.0[client] {
                        Session::None => Op::Connect { timeout_ms: [3000, 3600, 4000][rng.gen_range(0..3)] },
                        Session::Live { .. } => op(rng),
                    };
                    sessions.sent(client, &op, t);
                    steps.push(Step { at_ms: t, action: Action::Client { client, op } });
                }
            }
        }
        steps
    }

    /// No step falls where a session may be expiring, and the server stops only away from that.
    fn valid(steps: &[Step<Op>]) -> bool {
        let clients = steps.iter().filter_map(|s| match s.action {
            Action::Client { client, .. } => Some(client + 1),
            _ => None,
        });
        let mut sessions = Sessions(vec![Session::None; clients.max().unwrap_or(0)]);
        steps.iter().all(|s| {
            if sessions.hit(s.at_ms).is_some() {
                return false;
            }
            sessions.expire(s.at_ms);
            match &s.action {
                Action::Client { client, op } => sessions.sent(*client, op, s.at_ms),
                Action::Restart { .. } => sessions.restarted(s.at_ms),
                Action::Stop { ms } => return sessions.may_stop(s.at_ms, *ms),
            }
            true
        })
    }

    fn kind(op: &Op) -> &'static str {
        match op {
            Op::Connect { .. } => "connect",
            Op::CreateWithParents { .. } => "create with parents",
            Op::DeleteFirstChild { .. } => "delete the first child",
            Op::Events => "watch events",
            Op::Request(op) => match op {
                ZkOp::Create { mode: CreateMode::Persistent, .. } => "create persistent",
                ZkOp::Create { mode: CreateMode::Ephemeral, .. } => "create ephemeral",
                ZkOp::Create { .. } => "create sequential",
                ZkOp::Delete { version: -1, .. } => "delete",
                ZkOp::Delete { .. } => "delete with version",
                ZkOp::SetData { .. } => "setData",
                ZkOp::Exists { watch: true, .. } => "exists with watch",
                ZkOp::Exists { .. } => "exists",
                ZkOp::GetData { watch: true, .. } => "getData with watch",
                ZkOp::GetData { .. } => "getData",
                ZkOp::GetChildren { watch: true, .. } => "getChildren with watch",
                ZkOp::GetChildren { .. } => "getChildren",
                ZkOp::RemoveWatches { .. } => "removeWatches",
                ZkOp::Multi(_) => "multi",
                ZkOp::Sync { .. } => "sync",
                ZkOp::Ping => "ping",
                ZkOp::Close => "close session",
            },
        }
    }

    fn model(&self, steps: &[Step<Op>]) -> Vec<Answer> {
        let mut m = ModelRun {
            server: (self.model)(),
            out: Out::default(),
            sessions: BTreeMap::new(),
            reattach: Vec::new(),
            events: BTreeMap::new(),
            names: Names::default(),
        };
        let (mut stop, mut next_tick) = ((0, 0), TICK_MS);
        let mut answers = Vec::new();
        for s in steps {
            let at = if (stop.0..stop.1).contains(&s.at_ms) { stop.1 } else { s.at_ms };
            next_tick = ticks(TICK_MS, next_tick, stop, at, |t| m.server.tick(Now::at(t as i64), &mut m.out));
            m.collect();
            match &s.action {
                Action::Stop { ms } => stop = (s.at_ms, s.at_ms + ms),
                Action::Restart { .. } => {
                    m.server.recover(s.at_ms as i64);
                    m.reattach = m.sessions.keys().copied().collect();
                }
                Action::Client { client, op } => {
                    let text = m.play(at, *client, op);
                    m.collect();
                    answers.push(Answer { text, at_ms: at });
                }
            }
        }
        answers
    }

    fn reset(server: &Server) -> anyhow::Result<Run> {
        let mut conn = match jute::Conn::connect(server.addr().0, 4000, None, 0)? {
            Ok(conn) => conn,
            Err(jute::Expired) => anyhow::bail!("ZooKeeper refused a new session"),
        };
        delete_tree(&mut conn, "/s")?;
        conn.call(jute::CLOSE_SESSION, Body::default())?;
        Ok(Run::default())
    }

    fn connect(addr: &Addr, run: &Arc<Run>, index: usize) -> anyhow::Result<Client> {
        Ok(Client { addr: *addr, run: run.clone(), index, conn: None, timeout_ms: 0, reattach: false })
    }

    fn send(client: &mut Client, op: &Op) -> anyhow::Result<String> {
        client.send(op)
    }

    fn reconnect(client: &mut Client) {
        client.reattach = true;
    }
}

/// Everything under `path`, deepest first, and `path` itself.
fn delete_tree(conn: &mut jute::Conn, path: &str) -> anyhow::Result<()> {
    let (err, body) = conn.call(jute::GET_CHILDREN2, Body::default().str(path).bool(false))?;
    if err != 0 {
        return Ok(());
    }
    let mut r = jute::reader(&body);
    let children: Vec<String> = (0..r.int()?).map(|_| r.str()).collect::<Result<_, _>>()?;
    for child in children {
        delete_tree(conn, &format!("{path}/{child}"))?;
    }
    conn.call(jute::DELETE, Body::default().str(path).int(-1))?;
    Ok(())
}

/// Names for what differs between runs: zxids by rank, sessions by client.
#[derive(Default)]
pub struct Names {
    zxids: BTreeMap<i64, usize>,
    sessions: BTreeMap<i64, usize>,
}

impl Names {
    fn zxid(&mut self, z: i64) -> String {
        let next = self.zxids.len() + 1;
        format!("z{}", self.zxids.entry(z).or_insert(next))
    }

    fn stat(&mut self, s: &Stat) -> String {
        let owner = match s.ephemeral_owner {
            0 => "persistent".to_string(),
            id => {
                self.sessions.get(&(id as i64)).map_or("ephemeral of ?".into(), |c| format!("ephemeral of client-{c}"))
            }
        };
        let (cz, mz, pz) = (self.zxid(s.czxid as i64), self.zxid(s.mzxid as i64), self.zxid(s.pzxid as i64));
        format!("v{} cv{} n{} {owner} czxid {cz} mzxid {mz} pzxid {pz}", s.version, s.cversion, s.num_children)
    }

    fn reply(&mut self, reply: &ZkReply) -> String {
        match reply {
            ZkReply::Connected { timeout_ms, .. } => format!("connected, timeout {timeout_ms} ms"),
            ZkReply::Pong => "pong".into(),
            ZkReply::Created { path, stat } => format!("created {path} {}", self.stat(stat)),
            ZkReply::Deleted => "deleted".into(),
            ZkReply::DataSet(stat) => format!("set {}", self.stat(stat)),
            ZkReply::Exists(Some(stat)) => format!("exists {}", self.stat(stat)),
            ZkReply::Exists(None) => "no node".into(),
            ZkReply::Data { data, stat } => format!("data {data:?} {}", self.stat(stat)),
            ZkReply::Children { children, stat } => {
                let mut children = children.clone();
                children.sort();
                format!("children [{}] {}", children.join(", "), self.stat(stat))
            }
            ZkReply::WatchesRemoved => "watches removed".into(),
            ZkReply::Multi(Ok(replies)) => {
                let replies: Vec<String> = replies.iter().map(|r| self.reply(r)).collect();
                format!("multi [{}]", replies.join("; "))
            }
            ZkReply::Multi(Err((i, e))) => format!("multi failed at op {i}: error {e:?}"),
            ZkReply::Checked => "checked".into(),
            ZkReply::CreatedPath { path } => format!("created {path}"),
            ZkReply::Synced { path } => format!("synced {path}"),
            ZkReply::Closed => "closed".into(),
            ZkReply::Error(e) => format!("error {e:?}"),
        }
    }
}

fn show_event(kind: &str, path: &str) -> String {
    format!("{kind} {path}")
}

/// The model's side of a run.
struct ModelRun {
    server: Box<ModelOf<ZkState>>,
    out: Out,
    /// Each client's current session.
    sessions: BTreeMap<usize, u64>,
    /// Clients that must re-attach their session before their next request (the server restarted).
    reattach: Vec<usize>,
    events: BTreeMap<usize, Vec<String>>,
    names: Names,
}

impl ModelRun {
    fn collect(&mut self) {
        // What the scripts compare is the answers and the events: a connection the model closes (an
        // expired session's) is the next connect's to find.
        self.out.events.clear();
        self.out.closes.clear();
        for (node, push) in self.out.pushes.drain(..) {
            if let Ok(e) = push.downcast::<WatchEvent>() {
                if self.sessions.get(&(node.0 as usize)) == Some(&e.session) {
                    self.events
                        .entry(node.0 as usize)
                        .or_default()
                        .push(show_event(&format!("{:?}", e.event), &e.path));
                }
            }
        }
    }

    fn call(&mut self, at: u64, client: usize, request: ZkRequest) -> ZkReply {
        self.server.apply(Now::at(at as i64), NodeIx(client as u32), request, &mut self.out).reply
    }

    fn op(&mut self, at: u64, client: usize, op: ZkOp) -> ZkReply {
        let session = self.sessions.get(&client).copied().unwrap_or(0);
        self.call(at, client, ZkRequest::Op { session, op })
    }

    fn play(&mut self, at: u64, client: usize, op: &Op) -> String {
        if let Op::Connect { timeout_ms } = op {
            let reply =
                self.call(at, client, ZkRequest::Connect { requested_ms: *timeout_ms, session: None, last_zxid: 0 });
            if let ZkReply::Connected { session, .. } = reply {
                self.sessions.insert(client, session);
                self.names.sessions.insert(session as i64, client);
                self.events.remove(&client);
            }
            return self.names.reply(&reply);
        }
        if let Some(i) = self.reattach.iter().position(|c| *c == client) {
            self.reattach.remove(i);
            let session = self.sessions.get(&client).copied();
            if let ZkReply::Error(e) =
                self.call(at, client, ZkRequest::Connect { requested_ms: 0, session, last_zxid: 0 })
            {
                return format!("error {e:?}");
            }
        }
        let reply = match op {
            Op::Connect { .. } => unreachable!("answered above"),
            Op::Request(op) => self.op(at, client, op.clone()),
            Op::CreateWithParents { path, data, mode } => {
                for ancestor in ancestors(path) {
                    let create = ZkOp::Create { path: ancestor, data: String::new(), mode: CreateMode::Persistent };
                    if let e @ ZkReply::Error(ZkError::SessionExpired) = self.op(at, client, create) {
                        return self.names.reply(&e);
                    }
                }
                self.op(at, client, ZkOp::Create { path: path.clone(), data: data.clone(), mode: *mode })
            }
            Op::DeleteFirstChild { parent } => {
                match self.op(at, client, ZkOp::GetChildren { path: parent.clone(), watch: false }) {
                    ZkReply::Children { mut children, .. } if !children.is_empty() => {
                        children.sort();
                        let path = format!("{parent}/{}", children[0]);
                        let reply = self.op(at, client, ZkOp::Delete { path: path.clone(), version: -1 });
                        return format!("{path}: {}", self.names.reply(&reply));
                    }
                    ZkReply::Children { .. } => return "no children".into(),
                    other => other,
                }
            }
            Op::Events => match self.op(at, client, ZkOp::Ping) {
                ZkReply::Pong => {
                    self.collect();
                    return self.events.remove(&client).unwrap_or_default().join(" | ");
                }
                other => other,
            },
        };
        self.names.reply(&reply)
    }
}

/// `/s/a/x` → `/s`, `/s/a`.
fn ancestors(path: &str) -> Vec<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    (1..parts.len()).map(|n| format!("/{}", parts[..n].join("/"))).collect()
}

/// What the clients of one real run share: the names of zxids and sessions.
#[derive(Default)]
pub struct Run {
    names: Mutex<Names>,
}

/// One client of the real server: its session's connection.
pub struct Client {
    addr: Addr,
    run: Arc<Run>,
    /// Which client this is (an ephemeral node's owner is shown by it).
    index: usize,
    conn: Option<jute::Conn>,
    timeout_ms: i32,
    /// The server restarted: re-attach before the next request.
    reattach: bool,
}

/// `KeeperException.Code` values the model names.
fn error(code: i32) -> String {
    match jute::error(code) {
        Some(e) => format!("error {e:?}"),
        None => format!("error code {code}"),
    }
}

/// A request the server refused, by its `KeeperException.Code`; shown as the model shows its error.
#[derive(Clone, Copy)]
struct Refused(i32);

impl Refused {
    /// The session is gone (also when no connection could be re-attached to send on).
    const SESSION_EXPIRED: Refused = Refused(-112);

    fn is(self, e: ZkError) -> bool {
        jute::error(self.0) == Some(e)
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", error(self.0))
    }
}

impl Client {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.run.names.lock().expect("names lock")
    }

    fn stat(&self, s: jute::Stat) -> Stat {
        s.into()
    }

    /// Re-attach the session on a new connection; `false` if the server says it has expired.
    fn reattach(&mut self) -> anyhow::Result<bool> {
        let Some(mut old) = self.conn.take() else { return Ok(false) };
        old.drain();
        match jute::Conn::connect(
            self.addr.0,
            self.timeout_ms,
            Some((old.session, old.password.clone())),
            old.last_zxid,
        )? {
            Ok(mut conn) => {
                conn.resume(old)?;
                self.conn = Some(conn);
                Ok(true)
            }
            Err(jute::Expired) => Ok(false),
        }
    }

    /// One request; a connection the server closed (the session ended, or the server restarted) is
    /// re-attached once, and the request sent again only if nothing was answered on the old one.
    fn call(&mut self, op: i32, body: impl Fn() -> Body) -> anyhow::Result<Result<Vec<u8>, Refused>> {
        Ok(match self.call_coded(op, body)? {
            Ok((0, body)) => Ok(body),
            Ok((code, _)) => Err(Refused(code)),
            Err(e) => Err(e),
        })
    }

    /// [`Client::call`], with the answer's error code beside its body (a failed `multi` has both).
    fn call_coded(&mut self, op: i32, body: impl Fn() -> Body) -> anyhow::Result<Result<(i32, Vec<u8>), Refused>> {
        if std::mem::take(&mut self.reattach) && !self.reattach()? {
            return Ok(Err(Refused::SESSION_EXPIRED));
        }
        let Some(conn) = self.conn.as_mut() else { return Ok(Err(Refused::SESSION_EXPIRED)) };
        Ok(Ok(match conn.call(op, body()) {
            Ok(answer) => answer,
            Err(_) if self.reattach()? => self.conn.as_mut().expect("re-attached").call(op, body())?,
            Err(_) => return Ok(Err(Refused::SESSION_EXPIRED)),
        }))
    }

    /// Remember a watch the server set on `path`, in the set `kind` picks (a failed call sets none, but
    /// an `exists` on a missing node does).
    fn watched(&mut self, path: &str, kind: impl Fn(&mut jute::Watches) -> &mut std::collections::BTreeSet<String>) {
        if let Some(conn) = self.conn.as_mut() {
            kind(&mut conn.watches).insert(path.to_string());
        }
    }

    /// `multi`: each operation's `MultiHeader` and request, then the end marker; the answer in the
    /// model's words — every operation's result, or the first that failed.
    fn multi(&mut self, ops: &[TxnOp]) -> anyhow::Result<String> {
        let body = || {
            let mut body = Body::default();
            for op in ops {
                body = match op {
                    TxnOp::Create { path, data, mode } => body
                        .int(jute::CREATE2)
                        .bool(false)
                        .int(-1)
                        .str(path)
                        .str(data)
                        .open_acl()
                        .int(jute::flags(*mode)),
                    TxnOp::Delete { path, version } => {
                        body.int(jute::DELETE).bool(false).int(-1).str(path).int(*version)
                    }
                    TxnOp::SetData { path, data, version } => {
                        body.int(jute::SET_DATA).bool(false).int(-1).str(path).str(data).int(*version)
                    }
                    TxnOp::Check { path, version } => body.int(jute::CHECK).bool(false).int(-1).str(path).int(*version),
                };
            }
            body.int(-1).bool(true).int(-1)
        };
        let (code, body) = match self.call_coded(jute::MULTI, body)? {
            Ok(answer) => answer,
            Err(e) => return Ok(e.to_string()),
        };
        let mut r = jute::reader(&body);
        let mut results = Vec::new();
        loop {
            let (kind, done, err) = r.multi_header()?;
            if done {
                break;
            }
            results.push(match kind {
                jute::ERROR => Err(r.int()?),
                // ZooKeeper 3.8 answers a create in a multi with its path alone (`CreateResult`, type
                // create), even one sent as create2.
                jute::CREATE => Ok(format!("created {}", r.str()?)),
                jute::DELETE => Ok("deleted".into()),
                jute::SET_DATA => {
                    let stat = self.stat(r.stat()?);
                    Ok(format!("set {}", self.names().stat(&stat)))
                }
                jute::CHECK => Ok("checked".into()),
                other => anyhow::bail!("a multi result of type {other} (error {err})"),
            });
        }
        // Operations before the one that failed answer 0 (rolled back), those after it
        // RUNTIMEINCONSISTENCY (-2): the failure is the first other code.
        if let Some((i, e)) = results
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().filter(|e| **e != 0 && **e != -2).map(|e| (i, *e)))
        {
            return Ok(format!("multi failed at op {i}: {}", error(e)));
        }
        if code != 0 {
            return Ok(error(code));
        }
        let results: Vec<String> = results.into_iter().map(|r| r.unwrap_or_else(error)).collect();
        Ok(format!("multi [{}]", results.join("; ")))
    }

    /// `create2`: the path created and its stat, or the error.
    fn create(&mut self, path: &str, data: &str, mode: CreateMode) -> anyhow::Result<Result<(String, Stat), Refused>> {
        let flags = jute::flags(mode);
        Ok(match self.call(jute::CREATE2, || Body::default().str(path).str(data).open_acl().int(flags))? {
            Ok(body) => {
                let mut r = jute::reader(&body);
                let (path, stat) = (r.str()?, r.stat()?);
                Ok((path, self.stat(stat)))
            }
            Err(e) => Err(e),
        })
    }

    fn children(&mut self, path: &str, watch: bool) -> anyhow::Result<Result<(Vec<String>, Stat), Refused>> {
        Ok(match self.call(jute::GET_CHILDREN2, || Body::default().str(path).bool(watch))? {
            Ok(body) => {
                let mut r = jute::reader(&body);
                let mut children: Vec<String> = (0..r.int()?).map(|_| r.str()).collect::<Result<_, _>>()?;
                children.sort();
                Ok((children, self.stat(r.stat()?)))
            }
            Err(e) => Err(e),
        })
    }

    /// A stat answer in the model's words (`label` and the stat), or the refusal.
    fn stat_answer(
        &mut self,
        op: i32,
        body: impl Fn() -> Body,
        label: &str,
    ) -> anyhow::Result<Result<String, Refused>> {
        Ok(match self.call(op, body)? {
            Ok(body) => {
                let stat = self.stat(jute::reader(&body).stat()?);
                Ok(format!("{label} {}", self.names().stat(&stat)))
            }
            Err(e) => Err(e),
        })
    }

    fn send(&mut self, op: &Op) -> anyhow::Result<String> {
        match op {
            Op::Connect { timeout_ms } => {
                let conn = match jute::Conn::connect(self.addr.0, *timeout_ms as i32, None, 0)? {
                    Ok(conn) => conn,
                    Err(jute::Expired) => return Ok("error SessionExpired".into()),
                };
                self.timeout_ms = conn.timeout;
                self.names().sessions.insert(conn.session, self.index);
                let said = format!("connected, timeout {} ms", conn.timeout);
                self.conn = Some(conn);
                self.reattach = false;
                Ok(said)
            }
            Op::CreateWithParents { path, data, mode } => {
                for ancestor in ancestors(path) {
                    if let Err(e) = self.create(&ancestor, "", CreateMode::Persistent)? {
                        if e.is(ZkError::SessionExpired) {
                            return Ok(e.to_string());
                        }
                    }
                }
                self.send(&Op::Request(ZkOp::Create { path: path.clone(), data: data.clone(), mode: *mode }))
            }
            Op::Request(ZkOp::Create { path, data, mode }) => Ok(match self.create(path, data, *mode)? {
                Ok((path, stat)) => format!("created {path} {}", self.names().stat(&stat)),
                Err(e) => e.to_string(),
            }),
            Op::Request(ZkOp::Delete { path, version }) => {
                Ok(match self.call(jute::DELETE, || Body::default().str(path).int(*version))? {
                    Ok(_) => "deleted".into(),
                    Err(e) => e.to_string(),
                })
            }
            Op::DeleteFirstChild { parent } => match self.children(parent, false)? {
                Ok((children, _)) if !children.is_empty() => {
                    let path = format!("{parent}/{}", children[0]);
                    let said = match self.call(jute::DELETE, || Body::default().str(&path).int(-1))? {
                        Ok(_) => "deleted".to_string(),
                        Err(e) => e.to_string(),
                    };
                    Ok(format!("{path}: {said}"))
                }
                Ok(_) => Ok("no children".into()),
                Err(e) => Ok(e.to_string()),
            },
            Op::Request(ZkOp::SetData { path, data, version }) => {
                let said =
                    self.stat_answer(jute::SET_DATA, || Body::default().str(path).str(data).int(*version), "set")?;
                Ok(said.unwrap_or_else(|e| e.to_string()))
            }
            Op::Request(ZkOp::Exists { path, watch }) => {
                let said = self.stat_answer(jute::EXISTS, || Body::default().str(path).bool(*watch), "exists")?;
                let no_node = said.as_ref().is_err_and(|e| e.is(ZkError::NoNode));
                if *watch && (said.is_ok() || no_node) {
                    self.watched(path, |w| if no_node { &mut w.exist } else { &mut w.data });
                }
                Ok(if no_node { "no node".into() } else { said.unwrap_or_else(|e| e.to_string()) })
            }
            Op::Request(ZkOp::GetData { path, watch }) => {
                Ok(match self.call(jute::GET_DATA, || Body::default().str(path).bool(*watch))? {
                    Ok(body) => {
                        let mut r = jute::reader(&body);
                        let data = String::from_utf8_lossy(&r.bytes()?).into_owned();
                        let stat = self.stat(r.stat()?);
                        if *watch {
                            self.watched(path, |w| &mut w.data);
                        }
                        format!("data {data:?} {}", self.names().stat(&stat))
                    }
                    Err(e) => e.to_string(),
                })
            }
            Op::Request(ZkOp::GetChildren { path, watch }) => Ok(match self.children(path, *watch)? {
                Ok((children, stat)) => {
                    if *watch {
                        self.watched(path, |w| &mut w.child);
                    }
                    format!("children [{}] {}", children.join(", "), self.names().stat(&stat))
                }
                Err(e) => e.to_string(),
            }),
            // `removeWatches(path, WatcherType.Any)`: type 3.
            Op::Request(ZkOp::RemoveWatches { path }) => {
                if let Some(conn) = self.conn.as_mut() {
                    conn.watches.forget(path);
                }
                Ok(match self.call(jute::REMOVE_WATCHES, || Body::default().str(path).int(3))? {
                    Ok(_) => "watches removed".into(),
                    Err(e) => e.to_string(),
                })
            }
            Op::Request(ZkOp::Multi(ops)) => self.multi(ops),
            Op::Request(ZkOp::Sync { path }) => Ok(match self.call(jute::SYNC, || Body::default().str(path))? {
                Ok(body) => format!("synced {}", jute::reader(&body).str()?),
                Err(e) => e.to_string(),
            }),
            Op::Request(ZkOp::Ping) => Ok(match self.call(jute::PING, Body::default)? {
                Ok(_) => "pong".into(),
                Err(e) => e.to_string(),
            }),
            Op::Events => Ok(match self.call(jute::PING, Body::default)? {
                Ok(_) => {
                    let events = std::mem::take(&mut self.conn.as_mut().expect("answered").events);
                    let kinds = ["None", "NodeCreated", "NodeDeleted", "NodeDataChanged", "NodeChildrenChanged"];
                    let shown: Vec<String> = events
                        .iter()
                        .map(|e| show_event(kinds.get(e.kind as usize).copied().unwrap_or("other"), &e.path))
                        .collect();
                    shown.join(" | ")
                }
                Err(e) => e.to_string(),
            }),
            Op::Request(ZkOp::Close) => {
                let said = match self.call(jute::CLOSE_SESSION, Body::default)? {
                    Ok(_) => "closed".into(),
                    Err(e) => e.to_string(),
                };
                Ok(said)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::{coverage, script};

    fn ping() -> Op {
        Op::Request(ZkOp::Ping)
    }

    #[test]
    fn scripts_keep_to_the_grid_and_play_every_kind() {
        let mut counts = BTreeMap::new();
        for seed in 0..300 {
            let steps = script::<Zk>(seed);
            assert!(Zk::valid(&steps), "seed {seed}: nothing near a session's expiry");
            assert!(steps.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "seed {seed}: one step at a time");
            assert!(steps.iter().all(|s| s.at_ms % SLOT_MS == 0), "seed {seed}: on the grid");
            coverage::<Zk>(&steps, &mut counts);
        }
        for kind in [
            "connect",
            "create persistent",
            "create ephemeral",
            "create sequential",
            "create with parents",
            "delete",
            "delete with version",
            "delete the first child",
            "setData",
            "exists",
            "exists with watch",
            "getData",
            "getData with watch",
            "getChildren",
            "getChildren with watch",
            "removeWatches",
            "multi",
            "sync",
            "ping",
            "watch events",
            "close session",
            "stop",
            "restart (data kept)",
        ] {
            assert!(counts.get(kind).copied().unwrap_or(0) >= 5, "{kind}: {counts:?}");
        }
    }

    #[test]
    fn a_step_near_a_sessions_expiry_makes_a_script_invalid() {
        let client = |at_ms, op| Step { at_ms, action: Action::Client { client: 0, op } };
        let connect = client(0, Op::Connect { timeout_ms: 3000 });
        assert!(Zk::valid(&[connect.clone(), client(2800, ping()), client(5600, ping())]));
        assert!(!Zk::valid(&[connect.clone(), client(3000, ping())]), "at its timeout");
        assert!(!Zk::valid(&[connect.clone(), client(3300, ping())]), "within a tick after");
        assert!(Zk::valid(&[connect, client(3700, ping())]), "well after: expired, and said so alike");
    }

    #[test]
    fn the_model_expires_a_silent_session_and_its_ephemerals_with_their_watches() {
        let client = |at_ms, client, op| Step { at_ms, action: Action::Client { client, op } };
        let steps = vec![
            client(0, 0, Op::Connect { timeout_ms: 3000 }),
            client(100, 1, Op::Connect { timeout_ms: 4000 }),
            client(
                200,
                0,
                Op::Request(ZkOp::Create { path: "/s".into(), data: "".into(), mode: CreateMode::Ephemeral }),
            ),
            client(300, 1, Op::Request(ZkOp::Exists { path: "/s".into(), watch: true })),
            client(2500, 1, ping()),
            // Client 0 was last heard at 200 ms: expired by the tick at 3400 ms (200 + 3000, next tick).
            client(3700, 1, Op::Events),
            client(3800, 0, ping()),
        ];
        let answers: Vec<String> = Zk::default().model(&steps).into_iter().map(|a| a.text).collect();
        assert_eq!(answers[0], "connected, timeout 3000 ms");
        assert!(answers[2].starts_with("created /s v0 cv0 n0 ephemeral of client-0"), "{}", answers[2]);
        assert_eq!(answers[5], "NodeDeleted /s");
        assert_eq!(answers[6], "error SessionExpired");
    }
}
