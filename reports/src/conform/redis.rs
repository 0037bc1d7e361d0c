//! Redis: the simulated server (`locksim_sim::backend::redis::RedisState`) against `redis-server` 7.
//!
//! Scripts use the requests the recipes send — `SET` with `NX`/`XX`/`PX`, `GET`, `DEL`, `GETSET`,
//! `INCR`, `PEXPIRE`, `PTTL`, the compare-and-delete and compare-and-pexpire scripts by `EVAL`, and
//! `WAIT` — on three keys, from two or three clients, with restarts (AOF kept or wiped) and stops of
//! the server between them. The model is the request type itself: a script step *is* a
//! `RedisRequest`, sent to the real server as the command it stands for.

use super::servers::{Addr, Kind, Server};
use super::{resp, Action, Answer, Family, Step, SLOT_MS};
use locksim_sim::backend::redis::{RedisReply, RedisRequest, RedisState, Script, SetCondition};
use locksim_sim::backend::{Backend, Now, Out};
use locksim_sim::history::NodeIx;
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::sync::Arc;

/// The Lua the lock libraries send for the two scripts the model names (redis-py's and Redisson's
/// compare-and-delete, and the compare-and-pexpire of `Lock.extend`).
const COMPARE_AND_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const COMPARE_AND_PEXPIRE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

/// The Redis family, with the model it is checked against (a test swaps in a broken one).
pub struct Redis {
    pub model: fn() -> Box<dyn RedisModel>,
}

impl Default for Redis {
    fn default() -> Self {
        Redis { model: || Box::new(RedisState::default()) }
    }
}

/// What the conformance run needs of a Redis model: the backend, restartable.
pub trait RedisModel {
    fn apply(&mut self, now: Now, from: NodeIx, request: RedisRequest) -> RedisReply;
    fn parks(&self, request: &RedisRequest) -> bool;
    fn answer_parked(&mut self, from: NodeIx, request: &RedisRequest, timed_out: bool) -> Option<RedisReply>;
}

impl<B: Backend<Request = RedisRequest, Reply = RedisReply>> RedisModel for B {
    fn apply(&mut self, now: Now, from: NodeIx, request: RedisRequest) -> RedisReply {
        Backend::apply(self, now, from, request, &mut Out::default())
    }

    fn parks(&self, request: &RedisRequest) -> bool {
        Backend::parks(self, request).is_some()
    }

    fn answer_parked(&mut self, from: NodeIx, request: &RedisRequest, timed_out: bool) -> Option<RedisReply> {
        Backend::answer_parked(self, from, request, timed_out)
    }
}

/// A step's request, printed as the command it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Op(pub RedisRequest);

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = command(&self.0);
        let shown: Vec<String> =
            args.iter().map(|a| if a.contains(' ') { "<script>".into() } else { a.clone() }).collect();
        write!(f, "{}", shown.join(" "))
    }
}

/// The command a request stands for.
fn command(r: &RedisRequest) -> Vec<String> {
    let s = |x: &str| x.to_string();
    match r {
        RedisRequest::Set { key, value, condition, px_ms } => {
            let mut args = vec![s("SET"), key.clone(), value.clone()];
            match condition {
                SetCondition::Nx => args.push(s("NX")),
                SetCondition::Xx => args.push(s("XX")),
                SetCondition::Always => {}
            }
            if let Some(ms) = px_ms {
                args.extend([s("PX"), ms.to_string()]);
            }
            args
        }
        RedisRequest::Get { key } => vec![s("GET"), key.clone()],
        RedisRequest::Del { key } => vec![s("DEL"), key.clone()],
        RedisRequest::GetSet { key, value } => vec![s("GETSET"), key.clone(), value.clone()],
        RedisRequest::PExpire { key, ms } => vec![s("PEXPIRE"), key.clone(), ms.to_string()],
        RedisRequest::PTtl { key } => vec![s("PTTL"), key.clone()],
        RedisRequest::Incr { key } => vec![s("INCR"), key.clone()],
        RedisRequest::Eval { script: Script::CompareAndDelete, key, arg } => {
            vec![s("EVAL"), s(COMPARE_AND_DELETE), s("1"), key.clone(), arg.clone()]
        }
        RedisRequest::Eval { script: Script::CompareAndPexpire { ms }, key, arg } => {
            vec![s("EVAL"), s(COMPARE_AND_PEXPIRE), s("1"), key.clone(), arg.clone(), ms.to_string()]
        }
        RedisRequest::Wait { numreplicas, timeout_ms } => {
            vec![s("WAIT"), numreplicas.to_string(), timeout_ms.to_string()]
        }
        RedisRequest::InfoReplicas | RedisRequest::Replicate { .. } | RedisRequest::ReplAck { .. } => {
            unreachable!("scripts hold only client commands")
        }
    }
}

/// An answer as text. A TTL is given to the slot (`PTTL` 1250 → `ttl 12xx`): the script puts every
/// expiry half a slot away from every request, so the real server's few milliseconds of lateness never
/// change the slot.
fn show(request: &RedisRequest, reply: &RedisReply) -> String {
    match (request, reply) {
        (RedisRequest::PTtl { .. }, RedisReply::Int(ms)) if *ms >= 0 => format!("ttl {}xx", *ms as u64 / SLOT_MS),
        (_, RedisReply::Ok) => "OK".into(),
        (_, RedisReply::Nil) => "nil".into(),
        (_, RedisReply::Int(n)) => n.to_string(),
        (_, RedisReply::Bulk(s)) => format!("{s:?}"),
        (_, RedisReply::Error(e)) => format!("error {e}"),
    }
}

/// The real server's reply in the model's terms.
fn reply(value: resp::Value) -> RedisReply {
    match value {
        resp::Value::Simple(s) if s == "OK" => RedisReply::Ok,
        resp::Value::Simple(s) => RedisReply::Bulk(s),
        resp::Value::Error(e) => RedisReply::Error(e),
        resp::Value::Int(n) => RedisReply::Int(n),
        resp::Value::Bulk(None) | resp::Value::Array(None) => RedisReply::Nil,
        resp::Value::Bulk(Some(s)) => RedisReply::Bulk(s),
        resp::Value::Array(Some(items)) => RedisReply::Bulk(format!("{items:?}")),
    }
}

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const VALUES: [&str; 4] = ["a", "b", "7", "41"];

/// A time to live that ends half a slot between two requests: 150 ms to 1.55 s.
fn ttl(rng: &mut ChaCha8Rng) -> i64 {
    (rng.gen_range(1..=15) * SLOT_MS + SLOT_MS / 2) as i64
}

fn request(rng: &mut ChaCha8Rng) -> RedisRequest {
    let key = KEYS[rng.gen_range(0..KEYS.len())].to_string();
    let value = VALUES[rng.gen_range(0..VALUES.len())].to_string();
    match rng.gen_range(0..20) {
        0..=5 => {
            let condition = [SetCondition::Nx, SetCondition::Xx, SetCondition::Always][rng.gen_range(0..3)];
            let px_ms = rng.gen_bool(0.7).then(|| ttl(rng));
            RedisRequest::Set { key, value, condition, px_ms }
        }
        6 | 7 => RedisRequest::Get { key },
        8 => RedisRequest::Del { key },
        9 => RedisRequest::GetSet { key, value },
        10 => RedisRequest::Incr { key },
        11 => RedisRequest::PExpire { key, ms: if rng.gen_bool(0.1) { 0 } else { ttl(rng) } },
        12 | 13 => RedisRequest::PTtl { key },
        14 | 15 => RedisRequest::Eval { script: Script::CompareAndDelete, key, arg: value },
        16 | 17 => RedisRequest::Eval { script: Script::CompareAndPexpire { ms: ttl(rng) }, key, arg: value },
        _ => {
            let numreplicas = rng.gen_range(0..=1);
            RedisRequest::Wait { numreplicas, timeout_ms: (rng.gen_range(2..=4) * SLOT_MS) as i64 }
        }
    }
}

/// How long a request keeps its client waiting on a server without replicas (a `WAIT` for a replica
/// waits out its timeout).
fn blocks(r: &RedisRequest) -> u64 {
    match r {
        RedisRequest::Wait { numreplicas, timeout_ms } if *numreplicas > 0 => *timeout_ms as u64,
        _ => 0,
    }
}

impl Family for Redis {
    const NAME: &'static str = "redis";
    type Op = Op;
    type Conn = Client;
    type Shared = ();

    fn server() -> Kind {
        Kind::Redis
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
                        let op = request(rng);
                        let done = t + ms + blocks(&op);
                        steps.push(Step { at_ms: t + SLOT_MS, action: Action::Client { client, op: Op(op) } });
                        free_at[client] = done + SLOT_MS;
                    }
                    t += ms;
                }
                _ => {
                    let ready: Vec<usize> = (0..clients).filter(|c| free_at[*c] <= t).collect();
                    let Some(&client) = ready.get(rng.gen_range(0..ready.len().max(1))) else { continue };
                    let op = request(rng);
                    free_at[client] = t + blocks(&op) + SLOT_MS;
                    steps.push(Step { at_ms: t, action: Action::Client { client, op: Op(op) } });
                }
            }
        }
        steps
    }

    fn kind(op: &Op) -> &'static str {
        match &op.0 {
            RedisRequest::Set { condition: SetCondition::Nx, .. } => "SET NX",
            RedisRequest::Set { condition: SetCondition::Xx, .. } => "SET XX",
            RedisRequest::Set { .. } => "SET",
            RedisRequest::Get { .. } => "GET",
            RedisRequest::Del { .. } => "DEL",
            RedisRequest::GetSet { .. } => "GETSET",
            RedisRequest::Incr { .. } => "INCR",
            RedisRequest::PExpire { .. } => "PEXPIRE",
            RedisRequest::PTtl { .. } => "PTTL",
            RedisRequest::Eval { script: Script::CompareAndDelete, .. } => "EVAL compare-and-delete",
            RedisRequest::Eval { .. } => "EVAL compare-and-pexpire",
            RedisRequest::Wait { .. } => "WAIT",
            _ => "other",
        }
    }

    fn model(&self, steps: &[Step<Op>]) -> Vec<Answer> {
        let mut server = (self.model)();
        let mut stopped_until = 0;
        let mut answers = Vec::new();
        for s in steps {
            match &s.action {
                Action::Restart { keep: false } => server = (self.model)(),
                Action::Restart { keep: true } => {}
                Action::Stop { ms } => stopped_until = s.at_ms + ms,
                Action::Client { client, op } => {
                    // A request sent to a stopped server is read when it continues.
                    let at = s.at_ms.max(stopped_until);
                    let (from, request) = (NodeIx(*client as u32), op.0.clone());
                    let now = Now::at(at as i64);
                    let (reply, at) = if server.parks(&request) {
                        // Without replicas nothing another client does can answer a WAIT early.
                        match server.answer_parked(from, &request, false) {
                            Some(reply) => (reply, at),
                            None => {
                                let end = at + blocks(&request);
                                (server.answer_parked(from, &request, true).expect("timed out"), end)
                            }
                        }
                    } else {
                        (server.apply(now, from, request.clone()), at)
                    };
                    answers.push(Answer { text: show(&request, &reply), at_ms: at });
                }
            }
        }
        answers
    }

    fn reset(server: &Server) -> anyhow::Result<()> {
        let mut c = Self::connect(&server.addr(), &Arc::new(()), 0)?;
        match c.conn()?.command(&["FLUSHALL"])? {
            resp::Value::Simple(ok) if ok == "OK" => Ok(()),
            other => anyhow::bail!("FLUSHALL answered {other:?}"),
        }
    }

    fn connect(addr: &Addr, _: &Arc<()>, _: usize) -> anyhow::Result<Client> {
        Ok(Client { addr: *addr, conn: None })
    }

    fn send(client: &mut Client, op: &Op) -> anyhow::Result<String> {
        let args = command(&op.0);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let value = client.conn()?.command(&args)?;
        Ok(show(&op.0, &reply(value)))
    }

    fn reconnect(client: &mut Client) {
        client.conn = None;
    }
}

/// A client's connection, opened when first used (and again after a restart).
pub struct Client {
    addr: Addr,
    conn: Option<resp::Conn>,
}

impl Client {
    fn conn(&mut self) -> anyhow::Result<&mut resp::Conn> {
        if self.conn.is_none() {
            let stream = std::net::TcpStream::connect(self.addr.0)?;
            self.conn = Some(resp::Conn::on(stream));
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::{coverage, script};

    fn client(at_ms: u64, client: usize, request: RedisRequest) -> Step<Op> {
        Step { at_ms, action: Action::Client { client, op: Op(request) } }
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
            "EVAL compare-and-delete",
            "EVAL compare-and-pexpire",
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
