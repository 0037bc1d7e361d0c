//! Redis: the simulated server (`locksim_sim::backend::redis::RedisState`) against `redis-server` 7.
//!
//! Scripts use the requests the recipes send — `SET` with `NX`/`XX`/`PX`, `GET`, `DEL`, `EXISTS`,
//! `GETSET`, `INCR`, `PEXPIRE`, `PTTL`, the hash commands, `PUBLISH`, `WAIT`, and the lock libraries'
//! own Lua scripts by `EVAL` (Redisson's lock, unlock and renewals, redsync's delete and touch,
//! compare-and-delete and compare-and-pexpire), `EVALSHA` and `SCRIPT LOAD` — on three keys, from two
//! or three clients, each with a pub/sub connection it may `SUBSCRIBE` on and read the messages that
//! reached it, with restarts (AOF kept or wiped) and stops of the server between them. A script step
//! is a `RedisRequest`, sent to the real server as the command it stands for.

use super::{Action, Answer, Family, ModelOf, Recover, Step, SLOT_MS};
use crate::servers::{Addr, Launcher, Server};
use crate::wire::resp;
use locksim_locks::redis::scripts::{
    REDISSON_LOCK, REDISSON_RENEW, REDISSON_RENEW_3_43, REDISSON_UNLOCK, REDSYNC_DELETE, REDSYNC_TOUCH,
};
use locksim_sim::backend::redis::{sha1_hex, PubSubMessage, RedisReply, RedisRequest, RedisState, SetCondition};
use locksim_sim::backend::{Now, Out};
use locksim_sim::history::NodeIx;
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The compare-and-delete and compare-and-pexpire scripts as redis-py and Jedis users write them.
const COMPARE_AND_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const COMPARE_AND_PEXPIRE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

/// The scripts steps send, by the names steps are printed with.
const SCRIPTS: [(&str, &str); 8] = [
    ("compare-and-delete", COMPARE_AND_DELETE),
    ("compare-and-pexpire", COMPARE_AND_PEXPIRE),
    ("redisson-lock", REDISSON_LOCK),
    ("redisson-unlock", REDISSON_UNLOCK),
    ("redisson-renew", REDISSON_RENEW),
    ("redisson-renew-3.43", REDISSON_RENEW_3_43),
    ("redsync-delete", REDSYNC_DELETE),
    ("redsync-touch", REDSYNC_TOUCH),
];

/// A script's name, by its text or its SHA1.
fn script_name(text_or_sha: &str) -> &'static str {
    let found = SCRIPTS.iter().find(|(_, text)| *text == text_or_sha || sha1_hex(text) == text_or_sha);
    found.map_or("script", |(name, _)| name)
}

/// The Redis family, with the model it is checked against (a test swaps in a broken one).
pub struct Redis {
    pub model: fn() -> Box<ModelOf<RedisState>>,
}

impl Default for Redis {
    fn default() -> Self {
        Redis { model: || Box::new(RedisState::default()) }
    }
}

impl Recover for RedisState {
    /// The process restarted with its dataset (AOF kept).
    fn recover(&mut self, _now_ms: i64) {
        RedisState::restart(self)
    }
}

/// A script step: a command on the client's connection, or on its pub/sub connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A command, on the client's command connection.
    Request(RedisRequest),
    /// `SUBSCRIBE channel` on the client's pub/sub connection (opened for it).
    Subscribe(String),
    /// The messages that reached the client's pub/sub connection since it last looked.
    Messages,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Request(r) => {
                let mut args = r.to_args();
                // A script is shown by name.
                let at = match r {
                    RedisRequest::Eval { .. } | RedisRequest::EvalSha { .. } => Some(1),
                    RedisRequest::ScriptLoad { .. } => Some(2),
                    _ => None,
                };
                if let Some(at) = at {
                    args[at] = format!("<{}>", script_name(&args[at]));
                }
                write!(f, "{}", args.join(" "))
            }
            Op::Subscribe(channel) => write!(f, "SUBSCRIBE {channel} (pub/sub connection)"),
            Op::Messages => write!(f, "messages"),
        }
    }
}

/// Whether a request runs Redisson's lock script, whose answer is a PTTL.
fn answers_a_ttl(r: &RedisRequest) -> bool {
    match r {
        RedisRequest::PTtl { .. } => true,
        RedisRequest::Eval { script, .. } => script == REDISSON_LOCK,
        RedisRequest::EvalSha { sha, .. } => *sha == sha1_hex(REDISSON_LOCK),
        _ => false,
    }
}

/// An answer as text. A TTL is given to the slot (`PTTL` 1250 → `ttl 12xx`): the script puts every
/// expiry half a slot away from every request, so the real server's few milliseconds of lateness never
/// change the slot.
fn show(request: &RedisRequest, reply: &RedisReply) -> String {
    match reply {
        RedisReply::Int(ms) if *ms >= 0 && answers_a_ttl(request) => format!("ttl {}xx", *ms as u64 / SLOT_MS),
        RedisReply::Ok => "OK".into(),
        RedisReply::Nil => "nil".into(),
        RedisReply::Int(n) => n.to_string(),
        RedisReply::Bulk(s) => format!("{s:?}"),
        RedisReply::Status(s) => format!("+{s}"),
        RedisReply::Array(items) => {
            let shown: Vec<String> = items.iter().map(|i| show(request, i)).collect();
            format!("[{}]", shown.join(", "))
        }
        RedisReply::Error(e) => format!("error {e}"),
    }
}

/// Messages as text, in the order they came.
fn show_messages(messages: &[PubSubMessage]) -> String {
    if messages.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = messages.iter().map(|m| format!("{}:{}", m.channel, m.message)).collect();
    shown.join(" ")
}

/// The real server's reply in the model's terms.
fn reply(value: resp::Value) -> RedisReply {
    match value {
        resp::Value::Simple(s) if s == "OK" => RedisReply::Ok,
        resp::Value::Simple(s) => RedisReply::Status(s),
        resp::Value::Error(e) => RedisReply::Error(e),
        resp::Value::Int(n) => RedisReply::Int(n),
        resp::Value::Bulk(None) | resp::Value::Array(None) => RedisReply::Nil,
        resp::Value::Bulk(Some(s)) => RedisReply::Bulk(s),
        resp::Value::Array(Some(items)) => RedisReply::Array(items.into_iter().map(reply).collect()),
    }
}

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const VALUES: [&str; 4] = ["a", "b", "7", "41"];
/// Lock names (`<instance>:<thread>`), the hash fields of Redisson's lock.
const OWNERS: [&str; 2] = ["A:1", "B:1"];
/// Unlock latches: a key of its own, or a lock's.
const LATCHES: [&str; 2] = ["u0", "k2"];
const CHANNEL: &str = "ch";

/// A time to live that ends half a slot between two requests: 150 ms to 1.55 s.
fn ttl(rng: &mut ChaCha8Rng) -> i64 {
    (rng.gen_range(1..=15) * SLOT_MS + SLOT_MS / 2) as i64
}

fn pick<'a>(rng: &mut ChaCha8Rng, from: &[&'a str]) -> &'a str {
    from[rng.gen_range(0..from.len())]
}

fn eval(script: &str, keys: &[&str], args: &[String]) -> RedisRequest {
    let keys = keys.iter().map(|k| k.to_string()).collect();
    RedisRequest::Eval { script: script.into(), keys, args: args.to_vec() }
}

/// A string command, a hash command, or `WAIT`.
fn plain(rng: &mut ChaCha8Rng, key: String, value: String) -> RedisRequest {
    let field = pick(rng, &OWNERS).to_string();
    match rng.gen_range(0..22) {
        0..=4 => {
            let condition = [SetCondition::Nx, SetCondition::Xx, SetCondition::Always][rng.gen_range(0..3)];
            let px_ms = rng.gen_bool(0.7).then(|| ttl(rng));
            RedisRequest::Set { key, value, condition, px_ms }
        }
        5 | 6 => RedisRequest::Get { key },
        7 => RedisRequest::Del { keys: vec![key] },
        8 => RedisRequest::Exists { keys: vec![key] },
        9 => RedisRequest::GetSet { key, value },
        10 => RedisRequest::Incr { key },
        11 => RedisRequest::PExpire { key, ms: if rng.gen_bool(0.1) { 0 } else { ttl(rng) } },
        12 | 13 => RedisRequest::PTtl { key },
        14 => RedisRequest::HSet { key, pairs: vec![(field, value)] },
        15 => RedisRequest::HGet { key, field },
        16 => RedisRequest::HIncrBy { key, field, by: [1, -1][rng.gen_range(0..2)] },
        17 => RedisRequest::HExists { key, field },
        18 => RedisRequest::HDel { key, fields: vec![field] },
        19 => RedisRequest::Publish { channel: CHANNEL.into(), message: value },
        _ => {
            let numreplicas = rng.gen_range(0..=1);
            RedisRequest::Wait { numreplicas, timeout_ms: (rng.gen_range(2..=4) * SLOT_MS) as i64 }
        }
    }
}

/// A script the lock libraries send, by `EVAL`, `EVALSHA` or `SCRIPT LOAD`.
fn scripted(rng: &mut ChaCha8Rng, key: String, value: String) -> RedisRequest {
    let (owner, lease) = (pick(rng, &OWNERS).to_string(), ttl(rng).to_string());
    let request = match rng.gen_range(0..8) {
        0 => eval(COMPARE_AND_DELETE, &[&key], &[value]),
        1 => eval(COMPARE_AND_PEXPIRE, &[&key], &[value, lease]),
        2 | 3 => eval(REDISSON_LOCK, &[&key], &[lease, owner]),
        4 | 5 => {
            let latch = pick(rng, &LATCHES);
            let args = ["0".into(), lease, owner, "publish".into(), ttl(rng).to_string()];
            eval(REDISSON_UNLOCK, &[&key, CHANNEL, latch], &args)
        }
        6 => match rng.gen_bool(0.5) {
            true => eval(REDISSON_RENEW, &[&key], &[lease, owner]),
            false => eval(REDISSON_RENEW_3_43, &[&key], &[lease, owner]),
        },
        _ => match rng.gen_bool(0.5) {
            true => eval(REDSYNC_DELETE, &[&key], &[value]),
            false => eval(REDSYNC_TOUCH, &[&key], &[value, lease]),
        },
    };
    let RedisRequest::Eval { script, keys, args } = request else { unreachable!("an EVAL") };
    match rng.gen_range(0..6) {
        0 => RedisRequest::EvalSha { sha: sha1_hex(&script), keys, args },
        1 => RedisRequest::ScriptLoad { script },
        _ => RedisRequest::Eval { script, keys, args },
    }
}

fn op(rng: &mut ChaCha8Rng) -> Op {
    let key = pick(rng, &KEYS).to_string();
    let value = pick(rng, &VALUES).to_string();
    match rng.gen_range(0..20) {
        0..=11 => Op::Request(plain(rng, key, value)),
        12..=16 => Op::Request(scripted(rng, key, value)),
        17 => Op::Subscribe(CHANNEL.into()),
        _ => Op::Messages,
    }
}

/// How long a request keeps its client waiting on a server without replicas (a `WAIT` for a replica
/// waits out its timeout).
fn blocks(op: &Op) -> u64 {
    match op {
        Op::Request(RedisRequest::Wait { numreplicas, timeout_ms }) if *numreplicas > 0 => *timeout_ms as u64,
        _ => 0,
    }
}

impl Family for Redis {
    const NAME: &'static str = "redis";
    const ABOUT: &'static str = "Redis 7 (`redis-server`).";
    type Op = Op;
    type Conn = Client;
    type Shared = ();

    fn server() -> &'static Launcher {
        &crate::servers::REDIS
    }

    fn script(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        let clients = rng.gen_range(2..=3);
        let mut free_at = vec![0u64; clients];
        let mut steps = Vec::new();
        let mut t = 0;
        for _ in 0..rng.gen_range(12..=30) {
            t += SLOT_MS * rng.gen_range(1..=3);
            let what = rng.gen_range(0..30);
            if what <= 1 {
                // A server fault waits until no request is in flight.
                t = t.max(free_at.iter().copied().max().unwrap_or(0));
            }
            match what {
                0 => {
                    // A restart takes real time: leave a second before the next request.
                    steps.push(Step { at_ms: t, action: Action::Restart { keep: rng.gen_bool(0.5) } });
                    t += 10 * SLOT_MS;
                    free_at.iter_mut().for_each(|f| *f = (*f).max(t));
                }
                1 => {
                    // One client's request waits out the stop; nobody else sends meanwhile (requests
                    // from two clients queued in a stopped server are served in no fixed order).
                    let ms = SLOT_MS * rng.gen_range(2..=8);
                    steps.push(Step { at_ms: t, action: Action::Stop { ms } });
                    let client = rng.gen_range(0..clients);
                    if free_at[client] <= t + SLOT_MS && rng.gen_bool(0.7) {
                        let op = op(rng);
                        let done = t + ms + blocks(&op);
                        steps.push(Step { at_ms: t + SLOT_MS, action: Action::Client { client, op } });
                        free_at[client] = done + SLOT_MS;
                    }
                    t += ms;
                }
                _ => {
                    let ready: Vec<usize> = (0..clients).filter(|c| free_at[*c] <= t).collect();
                    let Some(&client) = ready.get(rng.gen_range(0..ready.len().max(1))) else { continue };
                    let op = op(rng);
                    free_at[client] = t + blocks(&op) + SLOT_MS;
                    steps.push(Step { at_ms: t, action: Action::Client { client, op } });
                }
            }
        }
        steps
    }

    fn kind(op: &Op) -> &'static str {
        let r = match op {
            Op::Subscribe(_) => return "SUBSCRIBE",
            Op::Messages => return "messages",
            Op::Request(r) => r,
        };
        match r {
            RedisRequest::Set { condition: SetCondition::Nx, .. } => "SET NX",
            RedisRequest::Set { condition: SetCondition::Xx, .. } => "SET XX",
            RedisRequest::Set { .. } => "SET",
            RedisRequest::Get { .. } => "GET",
            RedisRequest::Del { .. } => "DEL",
            RedisRequest::Exists { .. } => "EXISTS",
            RedisRequest::GetSet { .. } => "GETSET",
            RedisRequest::Incr { .. } => "INCR",
            RedisRequest::PExpire { .. } => "PEXPIRE",
            RedisRequest::PTtl { .. } => "PTTL",
            RedisRequest::HSet { .. } => "HSET",
            RedisRequest::HGet { .. } => "HGET",
            RedisRequest::HIncrBy { .. } => "HINCRBY",
            RedisRequest::HExists { .. } => "HEXISTS",
            RedisRequest::HDel { .. } => "HDEL",
            RedisRequest::Publish { .. } => "PUBLISH",
            RedisRequest::Eval { script, .. } => match script_name(script) {
                "compare-and-delete" => "EVAL compare-and-delete",
                "compare-and-pexpire" => "EVAL compare-and-pexpire",
                "redisson-lock" => "EVAL redisson-lock",
                "redisson-unlock" => "EVAL redisson-unlock",
                "redisson-renew" | "redisson-renew-3.43" => "EVAL redisson-renew",
                _ => "EVAL redsync",
            },
            RedisRequest::EvalSha { .. } => "EVALSHA",
            RedisRequest::ScriptLoad { .. } => "SCRIPT LOAD",
            RedisRequest::Wait { .. } => "WAIT",
            _ => "other",
        }
    }

    fn model(&self, steps: &[Step<Op>]) -> Vec<Answer> {
        let mut server = (self.model)();
        let mut stopped_until = 0;
        let mut answers = Vec::new();
        // What reached each client's pub/sub connection and was not read yet.
        let mut inbox: Vec<Vec<PubSubMessage>> = vec![Vec::new(); 3];
        for s in steps {
            match &s.action {
                Action::Restart { keep } => {
                    match keep {
                        false => server = (self.model)(),
                        true => server.recover(s.at_ms as i64),
                    }
                    // The pub/sub connections die with the server, and what they had not read with them.
                    inbox.iter_mut().for_each(Vec::clear);
                }
                Action::Stop { ms } => stopped_until = s.at_ms + ms,
                Action::Client { client, op } => {
                    // A request sent to a stopped server is read when it continues.
                    let at = s.at_ms.max(stopped_until);
                    let from = NodeIx(*client as u32);
                    let request = match op {
                        Op::Request(r) => r.clone(),
                        Op::Subscribe(channel) => RedisRequest::Subscribe { channel: channel.clone() },
                        Op::Messages => {
                            let read = std::mem::take(&mut inbox[*client]);
                            answers.push(Answer { text: show_messages(&read), at_ms: s.at_ms });
                            continue;
                        }
                    };
                    let mut out = Out::default();
                    let (reply, at) = if server.parks(&request).is_some() {
                        // Without replicas nothing another client does can answer a WAIT early.
                        match server.answer_parked(from, &request, false) {
                            Some(reply) => (reply, at),
                            None => {
                                let end = at + blocks(op);
                                (server.answer_parked(from, &request, true).expect("timed out"), end)
                            }
                        }
                    } else {
                        (server.apply(Now::at(at as i64), from, request.clone(), &mut out), at)
                    };
                    for (to, pushed) in out.pushes {
                        let message = pushed.downcast::<PubSubMessage>().expect("a server pushes messages");
                        inbox[to.0 as usize].push(*message);
                    }
                    answers.push(Answer { text: show(&request, &reply), at_ms: at });
                }
            }
        }
        answers
    }

    fn reset(server: &Server) -> anyhow::Result<()> {
        let mut c = Self::connect(&server.addr(), &Arc::new(()), 0)?;
        // The data, and the scripts an earlier script loaded (FLUSHALL keeps those).
        for command in [&["FLUSHALL"][..], &["SCRIPT", "FLUSH"]] {
            match Client::open(&mut c.conn, c.addr)?.command(command)? {
                resp::Value::Simple(ok) if ok == "OK" => {}
                other => anyhow::bail!("{} answered {other:?}", command.join(" ")),
            }
        }
        Ok(())
    }

    fn connect(addr: &Addr, _: &Arc<()>, _: usize) -> anyhow::Result<Client> {
        Ok(Client { addr: *addr, conn: None, pubsub: None, unread: Vec::new() })
    }

    fn send(client: &mut Client, op: &Op) -> anyhow::Result<String> {
        let (conn, request) = match op {
            Op::Request(r) => (Client::open(&mut client.conn, client.addr)?, r.clone()),
            Op::Subscribe(channel) => {
                // Messages already waiting on the connection come before the confirmation: keep them.
                let waiting = client.read_messages()?;
                client.unread.extend(waiting);
                (Client::open(&mut client.pubsub, client.addr)?, RedisRequest::Subscribe { channel: channel.clone() })
            }
            Op::Messages => {
                let mut read = std::mem::take(&mut client.unread);
                read.extend(client.read_messages()?);
                return Ok(show_messages(&read));
            }
        };
        let args = request.to_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(show(&request, &reply(conn.command(&args)?)))
    }

    fn reconnect(client: &mut Client) {
        (client.conn, client.pubsub) = (None, None);
        client.unread.clear();
    }
}

/// A client's connections, opened when first used (and again after a restart): one for commands, one
/// for pub/sub (a subscribed connection takes no other commands).
pub struct Client {
    addr: Addr,
    conn: Option<resp::Conn>,
    pubsub: Option<resp::Conn>,
    /// Messages read off the pub/sub connection before a `SUBSCRIBE`'s answer, not yet shown.
    unread: Vec<PubSubMessage>,
}

/// How long to listen for one more message: they were published a slot or more ago, on loopback.
const MESSAGE_WAIT: Duration = Duration::from_millis(5);

impl Client {
    fn open(conn: &mut Option<resp::Conn>, addr: Addr) -> anyhow::Result<&mut resp::Conn> {
        if conn.is_none() {
            let stream = std::net::TcpStream::connect(addr.0)?;
            *conn = Some(resp::Conn::on(stream));
        }
        Ok(conn.as_mut().expect("just connected"))
    }

    /// The `message` pushes waiting on the pub/sub connection.
    fn read_messages(&mut self) -> anyhow::Result<Vec<PubSubMessage>> {
        let Some(conn) = &mut self.pubsub else { return Ok(Vec::new()) };
        let mut read = Vec::new();
        for push in conn.pushes(MESSAGE_WAIT)? {
            match push {
                resp::Value::Array(Some(parts)) => match &parts[..] {
                    [resp::Value::Bulk(Some(kind)), resp::Value::Bulk(Some(channel)), resp::Value::Bulk(Some(message))]
                        if kind == "message" =>
                    {
                        read.push(PubSubMessage { channel: channel.clone(), message: message.clone() })
                    }
                    other => anyhow::bail!("not a message: {other:?}"),
                },
                other => anyhow::bail!("not a push: {other:?}"),
            }
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::{coverage, script};

    fn client(at_ms: u64, client: usize, request: RedisRequest) -> Step<Op> {
        Step { at_ms, action: Action::Client { client, op: Op::Request(request) } }
    }

    #[test]
    fn scripts_keep_to_the_grid_one_request_at_a_time() {
        for seed in 0..300 {
            let steps = script::<Redis>(seed);
            assert_eq!(steps, script::<Redis>(seed), "a seed's script is always the same");
            assert!(steps.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "seed {seed}: steps in time order");
            let mut times: Vec<u64> =
                steps.iter().filter(|s| matches!(s.action, Action::Client { .. })).map(|s| s.at_ms).collect();
            assert!(times.iter().all(|t| t % SLOT_MS == 0), "seed {seed}: requests on the grid");
            let n = times.len();
            times.dedup();
            assert_eq!(times.len(), n, "seed {seed}: never two requests at once");
            // No request is in flight when the server restarts or stops.
            let answers = Redis::default().model(&steps);
            let mut answered = answers.iter().map(|a| a.at_ms);
            let mut last = 0;
            for s in &steps {
                match s.action {
                    Action::Client { .. } => last = last.max(answered.next().unwrap()),
                    _ => assert!(last < s.at_ms, "seed {seed}: a fault at {} ms with a request in flight", s.at_ms),
                }
            }
        }
    }

    #[test]
    fn three_hundred_seeds_play_every_request_kind_and_every_server_fault() {
        let mut counts = std::collections::BTreeMap::new();
        (0..300).for_each(|seed| coverage::<Redis>(&script::<Redis>(seed), &mut counts));
        for kind in [
            "SET NX",
            "SET XX",
            "SET",
            "GET",
            "DEL",
            "GETSET",
            "INCR",
            "PEXPIRE",
            "PTTL",
            "EXISTS",
            "HSET",
            "HGET",
            "HINCRBY",
            "HEXISTS",
            "HDEL",
            "PUBLISH",
            "SUBSCRIBE",
            "messages",
            "EVAL compare-and-delete",
            "EVAL compare-and-pexpire",
            "EVAL redisson-lock",
            "EVAL redisson-unlock",
            "EVAL redisson-renew",
            "EVAL redsync",
            "EVALSHA",
            "SCRIPT LOAD",
            "WAIT",
            "restart (data kept)",
            "restart (data lost)",
            "stop",
        ] {
            assert!(counts.get(kind).copied().unwrap_or(0) >= 5, "{kind}: {counts:?}");
        }
    }

    #[test]
    fn the_model_answers_expiry_stops_restarts_and_wait_at_their_times() {
        let set = |value: &str, px| RedisRequest::Set {
            key: "k0".into(),
            value: value.into(),
            condition: SetCondition::Nx,
            px_ms: Some(px),
        };
        let get = || RedisRequest::Get { key: "k0".into() };
        let steps = vec![
            client(0, 0, set("a", 250)),
            client(100, 1, set("b", 250)),
            client(200, 1, RedisRequest::PTtl { key: "k0".into() }),
            Step { at_ms: 300, action: Action::Stop { ms: 300 } },
            client(400, 0, get()),
            client(700, 1, set("c", 1250)),
            Step { at_ms: 800, action: Action::Restart { keep: true } },
            client(1800, 0, get()),
            Step { at_ms: 1900, action: Action::Restart { keep: false } },
            client(2900, 0, get()),
            client(3000, 1, RedisRequest::Wait { numreplicas: 1, timeout_ms: 200 }),
            client(3100, 0, RedisRequest::Wait { numreplicas: 0, timeout_ms: 200 }),
        ];
        let answers = Redis::default().model(&steps);
        let shown: Vec<(&str, u64)> = answers.iter().map(|a| (a.text.as_str(), a.at_ms)).collect();
        assert_eq!(
            shown,
            vec![
                ("OK", 0),
                ("nil", 100),
                ("ttl 0xx", 200),
                // Read when the server continues, at 600 ms: the key expired at 250 ms.
                ("nil", 600),
                ("OK", 700),
                ("\"c\"", 1800),
                ("nil", 2900),
                ("0", 3200),
                ("0", 3100),
            ]
        );
    }
}
