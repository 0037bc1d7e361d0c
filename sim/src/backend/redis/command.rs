//! Commands by name: a command line (`["SET", "k", "v", "NX"]`) parsed into the typed [`RedisRequest`]
//! the server applies, and a request written back as its command line. A client's `COMMAND` request
//! and a script's `redis.call` both come through [`parse`], so they share one execution path with the
//! typed requests. The checks and their messages follow Redis 7.0 (`processCommand`: unknown command,
//! arity; `scriptCall`: the same for scripts, worded as scripts see them; then each command's own).

use super::{RedisRequest, SetCondition};

/// A command the model knows: its name, Redis's arity (positive: exactly; negative: at least), and
/// whether scripts may call it (Redis's `noscript` flag).
struct Spec {
    name: &'static str,
    arity: i32,
    in_scripts: bool,
}

const fn spec(name: &'static str, arity: i32, in_scripts: bool) -> Spec {
    Spec { name, arity, in_scripts }
}

/// The commands, with their arity from Redis 7.0's command table (`src/commands/*.json`).
const COMMANDS: &[Spec] = &[
    spec("set", -3, true),
    spec("get", 2, true),
    spec("del", -2, true),
    spec("exists", -2, true),
    spec("getset", 3, true),
    spec("pexpire", -3, true),
    spec("pttl", 2, true),
    spec("incr", 2, true),
    spec("hset", -4, true),
    spec("hget", 3, true),
    spec("hincrby", 4, true),
    spec("hexists", 3, true),
    spec("hdel", -3, true),
    spec("publish", 3, true),
    spec("ping", -1, true),
    spec("subscribe", -2, false),
    spec("unsubscribe", -1, false),
    spec("eval", -3, false),
    spec("evalsha", -3, false),
    spec("script", -2, false),
    spec("wait", 3, false),
];

pub const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";

/// Who sent the command line: a client, or a script through `redis.call` (whose errors read
/// differently, and which may not call every command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Client,
    Script,
}

/// Parse a command line into the request it names; `Err` is the error reply's text.
pub fn parse<S: AsRef<str>>(args: &[S], caller: Caller) -> Result<RedisRequest, String> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let Some(first) = args.first() else {
        return Err("ERR Please specify at least one argument for this redis lib call".into());
    };
    let name = first.to_ascii_lowercase();
    let Some(spec) = COMMANDS.iter().find(|c| c.name == name) else {
        return Err(match caller {
            Caller::Script => "ERR Unknown Redis command called from script".into(),
            Caller::Client => unknown_command(&args),
        });
    };
    let argc = args.len() as i32;
    if (spec.arity > 0 && argc != spec.arity) || argc < -spec.arity {
        return Err(match caller {
            Caller::Script => "ERR Wrong number of args calling Redis command from script".into(),
            Caller::Client => format!("ERR wrong number of arguments for '{name}' command"),
        });
    }
    if caller == Caller::Script && !spec.in_scripts {
        return Err("ERR This Redis command is not allowed from script".into());
    }
    typed(&name, &args[1..])
}

fn unknown_command(args: &[&str]) -> String {
    let mut shown = String::new();
    for a in &args[1..] {
        if shown.len() >= 128 {
            break;
        }
        shown.push_str(&format!("'{a}' "));
    }
    format!("ERR unknown command '{}', with args beginning with: {shown}", args[0])
}

/// Redis's `string2ll`: an optional minus, then digits without a leading zero (or just "0").
pub fn parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = digits == "0" && s.len() == 1 || digits.starts_with(|c: char| matches!(c, '1'..='9'));
    if !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn int(s: &str) -> Result<i64, String> {
    parse_int(s).ok_or_else(|| NOT_AN_INTEGER.to_string())
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The request a known command with a valid arity names (`a`: its arguments after the name).
fn typed(name: &str, a: &[&str]) -> Result<RedisRequest, String> {
    let key = || a[0].to_string();
    Ok(match name {
        "set" => set(a)?,
        "get" => RedisRequest::Get { key: key() },
        "del" => RedisRequest::Del { keys: owned(a) },
        "exists" => RedisRequest::Exists { keys: owned(a) },
        "getset" => RedisRequest::GetSet { key: key(), value: a[1].into() },
        "pexpire" if a.len() > 2 => return Err(format!("ERR Unsupported option {}", a[2])),
        "pexpire" => RedisRequest::PExpire { key: key(), ms: int(a[1])? },
        "pttl" => RedisRequest::PTtl { key: key() },
        "incr" => RedisRequest::Incr { key: key() },
        "hset" if a.len().is_multiple_of(2) => return Err("ERR wrong number of arguments for 'hset' command".into()),
        "hset" => {
            let pairs = a[1..].chunks(2).map(|p| (p[0].to_string(), p[1].to_string())).collect();
            RedisRequest::HSet { key: key(), pairs }
        }
        "hget" => RedisRequest::HGet { key: key(), field: a[1].into() },
        "hincrby" => RedisRequest::HIncrBy { key: key(), field: a[1].into(), by: int(a[2])? },
        "hexists" => RedisRequest::HExists { key: key(), field: a[1].into() },
        "hdel" => RedisRequest::HDel { key: key(), fields: owned(&a[1..]) },
        "publish" => RedisRequest::Publish { channel: a[0].into(), message: a[1].into() },
        "ping" if a.len() > 1 => return Err("ERR wrong number of arguments for 'ping' command".into()),
        "ping" => RedisRequest::Ping,
        "subscribe" | "unsubscribe" if a.len() != 1 => {
            return Err(format!("ERR the model {name}s one channel per command"));
        }
        "subscribe" => RedisRequest::Subscribe { channel: a[0].into() },
        "unsubscribe" => RedisRequest::Unsubscribe { channel: a[0].into() },
        "eval" | "evalsha" => eval(name, a)?,
        "script" => script(a)?,
        "wait" => RedisRequest::Wait { numreplicas: int(a[0])?, timeout_ms: int(a[1])? },
        _ => unreachable!("every command in COMMANDS is parsed"),
    })
}

/// `SET key value [NX|XX] [EX s|PX ms]` (Redis's `parseExtendedStringArgumentsOrReply`, then
/// `getExpireMillisecondsOrReply`).
fn set(a: &[&str]) -> Result<RedisRequest, String> {
    let (mut condition, mut expire) = (SetCondition::Always, None);
    let mut i = 2;
    while i < a.len() {
        let opt = a[i].to_ascii_lowercase();
        match opt.as_str() {
            "nx" if condition != SetCondition::Xx => condition = SetCondition::Nx,
            "xx" if condition != SetCondition::Nx => condition = SetCondition::Xx,
            "px" | "ex" if expire.is_none() && i + 1 < a.len() => {
                expire = Some((opt == "ex", a[i + 1]));
                i += 1;
            }
            _ => return Err(SYNTAX.into()),
        }
        i += 1;
    }
    let px_ms = match expire {
        None => None,
        Some((seconds, n)) => {
            let n = int(n)?;
            let ms = if seconds { n.checked_mul(1000) } else { Some(n) };
            match ms {
                Some(ms) if n > 0 => Some(ms),
                _ => return Err("ERR invalid expire time in 'set' command".into()),
            }
        }
    };
    Ok(RedisRequest::Set { key: a[0].into(), value: a[1].into(), condition, px_ms })
}

/// `EVAL script numkeys key… arg…` and `EVALSHA sha1 numkeys key… arg…`.
fn eval(name: &str, a: &[&str]) -> Result<RedisRequest, String> {
    let numkeys = int(a[1])?;
    if numkeys > a.len() as i64 - 2 {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    if numkeys < 0 {
        return Err("ERR Number of keys can't be negative".into());
    }
    let split = 2 + numkeys as usize;
    let (keys, args) = (owned(&a[2..split]), owned(&a[split..]));
    Ok(match name {
        "eval" => RedisRequest::Eval { script: a[0].into(), keys, args },
        _ => RedisRequest::EvalSha { sha: a[0].into(), keys, args },
    })
}

/// `SCRIPT LOAD script`, the one subcommand the model has.
fn script(a: &[&str]) -> Result<RedisRequest, String> {
    match a[0].to_ascii_lowercase().as_str() {
        "load" if a.len() == 2 => Ok(RedisRequest::ScriptLoad { script: a[1].into() }),
        "load" => Err("ERR wrong number of arguments for 'script|load' command".into()),
        _ => Err(format!("ERR unknown subcommand '{}'. Try SCRIPT HELP.", a[0])),
    }
}

impl RedisRequest {
    /// Whether the command writes to the dataset (Redis's `write` flag): a replica refuses it
    /// (`READONLY`), and so does a master short of good replicas (`NOREPLICAS`). Scripts are not: their
    /// writes are refused one by one, as `redis.call` makes them.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            RedisRequest::Set { .. }
                | RedisRequest::Del { .. }
                | RedisRequest::GetSet { .. }
                | RedisRequest::PExpire { .. }
                | RedisRequest::Incr { .. }
                | RedisRequest::HSet { .. }
                | RedisRequest::HIncrBy { .. }
                | RedisRequest::HDel { .. }
        )
    }

    /// Whether a client sends it: neither replication nor Sentinel traffic.
    pub fn from_a_client(&self) -> bool {
        !matches!(
            self,
            RedisRequest::Replicate { .. }
                | RedisRequest::ReplAck { .. }
                | RedisRequest::ReplSync
                | RedisRequest::ReplClose
                | RedisRequest::ReplicaOf { .. }
                | RedisRequest::Sentinel(_)
        )
    }

    /// Parse a client's command line (see [`parse`]).
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<RedisRequest, String> {
        parse(args, Caller::Client)
    }

    /// The command line this request stands for, as a client sends it to a real server.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let mut push = |parts: &[&str]| args.extend(parts.iter().map(|s| s.to_string()));
        match self {
            RedisRequest::Set { key, value, condition, px_ms } => {
                push(&["SET", key, value]);
                match condition {
                    SetCondition::Nx => push(&["NX"]),
                    SetCondition::Xx => push(&["XX"]),
                    SetCondition::Always => {}
                }
                if let Some(ms) = px_ms {
                    push(&["PX", &ms.to_string()]);
                }
            }
            RedisRequest::Get { key } => push(&["GET", key]),
            RedisRequest::Del { keys } => {
                push(&["DEL"]);
                keys.iter().for_each(|k| push(&[k]));
            }
            RedisRequest::Exists { keys } => {
                push(&["EXISTS"]);
                keys.iter().for_each(|k| push(&[k]));
            }
            RedisRequest::GetSet { key, value } => push(&["GETSET", key, value]),
            RedisRequest::PExpire { key, ms } => push(&["PEXPIRE", key, &ms.to_string()]),
            RedisRequest::PTtl { key } => push(&["PTTL", key]),
            RedisRequest::Incr { key } => push(&["INCR", key]),
            RedisRequest::HSet { key, pairs } => {
                push(&["HSET", key]);
                pairs.iter().for_each(|(f, v)| push(&[f, v]));
            }
            RedisRequest::HGet { key, field } => push(&["HGET", key, field]),
            RedisRequest::HIncrBy { key, field, by } => push(&["HINCRBY", key, field, &by.to_string()]),
            RedisRequest::HExists { key, field } => push(&["HEXISTS", key, field]),
            RedisRequest::HDel { key, fields } => {
                push(&["HDEL", key]);
                fields.iter().for_each(|f| push(&[f]));
            }
            RedisRequest::Publish { channel, message } => push(&["PUBLISH", channel, message]),
            RedisRequest::Subscribe { channel } => push(&["SUBSCRIBE", channel]),
            RedisRequest::Unsubscribe { channel } => push(&["UNSUBSCRIBE", channel]),
            RedisRequest::Ping => push(&["PING"]),
            RedisRequest::Eval { script, keys, args } => eval_args(&mut push, "EVAL", script, keys, args),
            RedisRequest::EvalSha { sha, keys, args } => eval_args(&mut push, "EVALSHA", sha, keys, args),
            RedisRequest::ScriptLoad { script } => push(&["SCRIPT", "LOAD", script]),
            RedisRequest::Wait { numreplicas, timeout_ms } => {
                push(&["WAIT", &numreplicas.to_string(), &timeout_ms.to_string()])
            }
            RedisRequest::InfoReplicas => push(&["INFO", "replication"]),
            RedisRequest::Command { args } => args.iter().for_each(|a| push(&[a])),
            request => unreachable!("{request:?}: replication and Sentinel traffic is not a client command"),
        }
        args
    }
}

fn eval_args(push: &mut impl FnMut(&[&str]), name: &str, body: &str, keys: &[String], args: &[String]) {
    push(&[name, body, &keys.len().to_string()]);
    keys.iter().chain(args).for_each(|a| push(&[a]));
}
