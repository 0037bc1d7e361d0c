//! The Redis family on a real server: [`RealRedis`], the recipes' [`RedisApi`](super::RedisApi) over
//! redis-rs (async, tokio), for real mode's client processes.
//!
//! It keeps the simulated client's contract ([`SimRedis`](super::SimRedis)), as redis-py does:
//! - every command waits at most its connection's timeout (`call_timeout`, redis-py's
//!   `socket_timeout`); a command that timed out is [`CallError::Timeout`] — it may have run — and, as
//!   redis-py disconnects after a socket timeout, the connection is dropped: the next command connects
//!   anew (within its own timeout);
//! - a connection that broke while a command was out is a timeout too (it may have run); one that
//!   could not be opened at all is [`CallError::Reset`] (nothing was sent);
//! - Redis errors (`NOSCRIPT …`, `WRONGTYPE …`) are replies, [`RedisReply::Error`], as the sim answers;
//! - `INFO replication` is reduced to its `connected_slaves`, as [`RedisRequest::InfoReplicas`] says.
//! - under Sentinel (real mode's members include Sentinels, [`RealServers::members`]), it is redis-py's
//!   Sentinel client, as the sim's is: on connecting it asks the Sentinels for the master in
//!   [`SentinelOrder`], reaches the address a Sentinel names through this process's own path to that
//!   member, stays on it until a command times out or breaks, and drops it at a `READONLY` reply.
//!
//! A subscription ([`RealSubscription`]) has a pub/sub connection of its own (Redisson shares one per
//! client; the messages are the same). If the server forgets it (a restart), no message comes, as in the
//! sim: a waiter then tries again when the lock would have expired.

use super::{SentinelOrder, SENTINEL_MASTER};
use crate::{RealMember, RealServers};
use futures_util::StreamExt;
use locksim_sim::backend::redis::{RedisReply, RedisRequest};
use locksim_sim::net::CallError;
use redis::aio::MultiplexedConnection;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

/// A connection to one real Redis server, or to the master Sentinel names, opened on first use and
/// again after a failure.
#[derive(Clone)]
pub struct RealRedis {
    target: Target,
    /// The server's client and its connection, shared by the clones of one connection
    /// ([`RealRedis::pinned`]).
    conn: Rc<RefCell<Option<(redis::Client, MultiplexedConnection)>>>,
    timeout: Duration,
}

/// Which server a [`RealRedis`] connects to.
#[derive(Clone)]
enum Target {
    /// Always the one.
    Server(redis::Client),
    /// The master the Sentinels name when it connects (redis-py's `Sentinel.master_for`).
    Sentinel(Rc<Sentinels>),
}

/// The Sentinels of a real run, as a client process is told of them ([`RealServers::members`]): where
/// it reaches each, the order it asks them in, and where it reaches each server that a Sentinel names
/// by its announced address (redis-py's `address_remap`).
struct Sentinels {
    reach: Vec<redis::Client>,
    order: SentinelOrder<usize>,
    remap: BTreeMap<String, String>,
}

/// How one command went wrong on the way, before any reply.
enum Broken {
    /// The connection could not be opened: nothing was sent.
    Unopened,
    /// The connection broke with the command out: it may have run.
    Lost,
}

impl RealRedis {
    /// A connection to the Redis of `servers` — a master under Sentinel if they are a cluster with
    /// Sentinels — whose commands wait at most `timeout`.
    pub fn new(servers: &RealServers, timeout: Duration) -> RealRedis {
        let open = |addr: &str| {
            redis::Client::open(format!("redis://{addr}/"))
                .unwrap_or_else(|e| panic!("{}: {addr} is not host:port: {e}", super::REAL.env))
        };
        let members = servers.members(&super::REAL).unwrap_or_default();
        let sentinels: Vec<&RealMember> = members.iter().filter(|m| m.node.starts_with("sentinel-")).collect();
        let target = match sentinels.is_empty() {
            true => Target::Server(open(servers.of(&super::REAL))),
            false => Target::Sentinel(Rc::new(Sentinels {
                reach: sentinels.iter().map(|s| open(&s.reach)).collect(),
                order: SentinelOrder::default(),
                remap: members.iter().map(|m| (m.announced.clone(), m.reach.clone())).collect(),
            })),
        };
        RealRedis { target, conn: Rc::default(), timeout }
    }

    /// The same connection with another timeout (one server at a time, so pinning is sharing).
    pub fn pinned(&self, timeout: Duration) -> RealRedis {
        RealRedis { timeout, ..self.clone() }
    }

    /// Send one command and wait for its reply, at most the timeout.
    pub async fn request(&self, request: &RedisRequest) -> Result<RedisReply, CallError> {
        let args = request.to_args();
        let mut cmd = redis::cmd(&args[0]);
        args[1..].iter().for_each(|a| {
            cmd.arg(a);
        });
        // Under Sentinel a connection is opened after the Sentinels are asked, each within its own
        // timeout, as redis-py's `SentinelManagedConnection.connect` does; none naming a master sends nothing.
        let Ok(server) = self.server().await else { return Err(CallError::Reset) };
        let answer = tokio::time::timeout(self.timeout, async {
            let mut conn = self.connection(server).await.map_err(|_| Broken::Unopened)?;
            match cmd.query_async::<redis::Value>(&mut conn).await {
                Ok(value) => Ok(reply(value)),
                Err(e) if broken(&e) => Err(Broken::Lost),
                Err(e) => Ok(RedisReply::Error(error_text(&e))),
            }
        })
        .await;
        let error = match answer {
            Ok(Ok(RedisReply::Bulk(text))) if *request == RedisRequest::InfoReplicas => {
                return Ok(connected_replicas(&text))
            }
            // redis-py's Sentinel-managed connection disconnects on READONLY: the server it is on was
            // demoted, and the next command asks the Sentinels again.
            Ok(Ok(RedisReply::Error(e))) if e.starts_with("READONLY") && matches!(self.target, Target::Sentinel(_)) => {
                self.conn.borrow_mut().take();
                return Ok(RedisReply::Error(e));
            }
            Ok(Ok(reply)) => return Ok(reply),
            Ok(Err(Broken::Unopened)) => CallError::Reset,
            Ok(Err(Broken::Lost)) | Err(_) => CallError::Timeout,
        };
        // redis-py disconnects after a socket timeout or a connection error: the next command reconnects.
        self.conn.borrow_mut().take();
        Err(error)
    }

    /// Send a command without waiting for its answer (Redisson's `writeAsync`).
    pub fn send(&self, request: RedisRequest) {
        let conn = self.clone();
        tokio::task::spawn_local(async move {
            let _ = conn.request(&request).await;
        });
    }

    /// `SUBSCRIBE channel` on a pub/sub connection of its own, waiting at most `timeout`.
    pub async fn subscribe(&self, channel: &str, timeout: Duration) -> Result<RealSubscription, CallError> {
        let subscribed = tokio::time::timeout(timeout, async {
            let client = self.server().await.map_err(|_| CallError::Reset)?;
            let mut pubsub = client.get_async_pubsub().await.map_err(|_| CallError::Reset)?;
            pubsub.subscribe(channel).await.map_err(|_| CallError::Timeout)?;
            Ok(pubsub)
        });
        let pubsub = subscribed.await.map_err(|_| CallError::Timeout)??;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let reader = tokio::task::spawn_local(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                if tx.send(message.get_payload::<String>().unwrap_or_default()).is_err() {
                    return;
                }
            }
        });
        Ok(RealSubscription { rx, reader })
    }

    /// The open connection, or a new one to `client` (the server it is on, [`RealRedis::server`]).
    async fn connection(&self, client: redis::Client) -> redis::RedisResult<MultiplexedConnection> {
        if let Some((_, conn)) = self.conn.borrow().clone() {
            return Ok(conn);
        }
        let conn = client.get_multiplexed_async_connection().await?;
        *self.conn.borrow_mut() = Some((client, conn.clone()));
        Ok(conn)
    }

    /// The server of the open connection, or the one to open one to: under Sentinel the master a
    /// Sentinel names (asked with this connection's timeout; none names one: `MasterNotFoundError`).
    async fn server(&self) -> redis::RedisResult<redis::Client> {
        if let Some((client, _)) = self.conn.borrow().clone() {
            return Ok(client);
        }
        match &self.target {
            Target::Server(client) => Ok(client.clone()),
            Target::Sentinel(sentinels) => {
                let ask = async |i: &usize| sentinels.ask(*i, self.timeout).await;
                let named = sentinels.order.discover(&(0..sentinels.reach.len()).collect::<Vec<_>>(), ask).await;
                let not_found = || redis::RedisError::from((redis::ErrorKind::IoError, "MasterNotFoundError"));
                named.ok_or_else(not_found)
            }
        }
    }
}

impl Sentinels {
    /// Ask Sentinel `i` for the master (`SENTINEL MASTERS`), within `timeout`: the master it names
    /// if it sees it up (redis-py's `check_master_state`: flagged `master`, neither `s_down` nor
    /// `o_down`), reached as this process reaches its announced address.
    async fn ask(&self, i: usize, timeout: Duration) -> Option<redis::Client> {
        let asked = tokio::time::timeout(timeout, async {
            let mut conn = self.reach[i].get_multiplexed_async_connection().await.ok()?;
            redis::cmd("SENTINEL").arg("MASTERS").query_async::<Vec<Vec<String>>>(&mut conn).await.ok()
        });
        let announced = named_master(&asked.await.ok()??)?;
        let reach = self.remap.get(&announced).unwrap_or(&announced);
        redis::Client::open(format!("redis://{reach}/")).ok()
    }
}

/// The master a Sentinel's `SENTINEL MASTERS` names, as `ip:port`, if it sees it up (redis-py's
/// `check_master_state`: flagged `master`, neither `s_down` nor `o_down`). Each master is a flat list
/// of fields and values.
fn named_master(masters: &[Vec<String>]) -> Option<String> {
    let field = |master: &[String], key: &str| {
        master.chunks(2).find(|kv| kv[0] == key).and_then(|kv| kv.get(1)).cloned().unwrap_or_default()
    };
    let master = masters.iter().find(|m| field(m, "name") == SENTINEL_MASTER)?;
    let flags = field(master, "flags");
    let flags: Vec<&str> = flags.split(',').collect();
    if !flags.contains(&"master") || flags.contains(&"s_down") || flags.contains(&"o_down") {
        return None;
    }
    Some(format!("{}:{}", field(master, "ip"), field(master, "port")))
}

/// Whether an error is the connection's (the command may have run), not a Redis error reply.
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// A Redis error as the server wrote it: `NOSCRIPT No matching script…`.
fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => format!("ERR {e}"),
    }
}

/// A reply in the family's terms (RESP2: Redis 7 speaks it unless asked for RESP3).
fn reply(value: redis::Value) -> RedisReply {
    use redis::Value as V;
    match value {
        V::Nil => RedisReply::Nil,
        V::Okay => RedisReply::Ok,
        V::SimpleString(s) if s == "OK" => RedisReply::Ok,
        V::SimpleString(s) => RedisReply::Status(s),
        V::Int(n) => RedisReply::Int(n),
        V::BulkString(bytes) => RedisReply::Bulk(String::from_utf8_lossy(&bytes).into_owned()),
        V::Array(items) | V::Set(items) => RedisReply::Array(items.into_iter().map(reply).collect()),
        V::ServerError(e) => RedisReply::Error(match e.details() {
            Some(detail) => format!("{} {detail}", e.code()),
            None => e.code().to_string(),
        }),
        other => RedisReply::Status(format!("{other:?}")),
    }
}

/// `INFO replication`'s text reduced to its `connected_slaves` (0 if absent), as the sim answers.
fn connected_replicas(text: &str) -> RedisReply {
    let n = text.lines().find_map(|l| l.strip_prefix("connected_slaves:")).and_then(|n| n.trim().parse().ok());
    RedisReply::Int(n.unwrap_or(0))
}

/// One subscriber of a channel on a real server; unsubscribed (its connection closed) when dropped.
pub struct RealSubscription {
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    reader: tokio::task::JoinHandle<()>,
}

impl RealSubscription {
    /// The next message on the channel, waiting for one if none has come (for ever once the connection
    /// is gone).
    pub async fn message(&mut self) -> String {
        match self.rx.recv().await {
            Some(message) => message,
            None => std::future::pending().await,
        }
    }
}

impl Drop for RealSubscription {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_the_sim_answers() {
        assert_eq!(reply(redis::Value::Okay), RedisReply::Ok);
        assert_eq!(reply(redis::Value::BulkString(b"7".to_vec())), RedisReply::Bulk("7".into()));
        assert_eq!(reply(redis::Value::Array(vec![redis::Value::Int(1)])), RedisReply::Array(vec![RedisReply::Int(1)]));
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n";
        assert_eq!(connected_replicas(info), RedisReply::Int(1));
    }

    #[test]
    fn a_sentinel_names_the_master_it_sees_up() {
        let master = |flags: &str| {
            let fields = [("name", SENTINEL_MASTER), ("ip", "127.0.0.1"), ("port", "6380"), ("flags", flags)];
            fields.iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect::<Vec<_>>()
        };
        assert_eq!(named_master(&[master("master")]), Some("127.0.0.1:6380".into()));
        assert_eq!(named_master(&[master("s_down,master")]), None);
        assert_eq!(named_master(&[master("o_down,s_down,master")]), None);
        assert_eq!(named_master(&[master("master,disconnected")]), Some("127.0.0.1:6380".into()));
        assert_eq!(named_master(&[]), None);
    }
}
