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
//!
//! A subscription ([`RealSubscription`]) has a pub/sub connection of its own (Redisson shares one per
//! client; the messages are the same). If the server forgets it (a restart), no message comes, as in the
//! sim: a waiter then tries again when the lock would have expired.

use futures_util::StreamExt;
use locksim_sim::backend::redis::{RedisReply, RedisRequest};
use locksim_sim::net::CallError;
use redis::aio::MultiplexedConnection;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// A connection to one real Redis server, opened on first use and again after a failure.
#[derive(Clone)]
pub struct RealRedis {
    client: redis::Client,
    /// Shared by the clones of one connection ([`RealRedis::pinned`]).
    conn: Rc<RefCell<Option<MultiplexedConnection>>>,
    timeout: Duration,
}

/// How one command went wrong on the way, before any reply.
enum Broken {
    /// The connection could not be opened: nothing was sent.
    Unopened,
    /// The connection broke with the command out: it may have run.
    Lost,
}

impl RealRedis {
    /// A connection to the server at `addr` (`host:port`) whose commands wait at most `timeout`.
    pub fn new(addr: &str, timeout: Duration) -> RealRedis {
        let client = redis::Client::open(format!("redis://{addr}/"))
            .unwrap_or_else(|e| panic!("LOCKSIM_REDIS={addr} is not host:port: {e}"));
        RealRedis { client, conn: Rc::default(), timeout }
    }

    /// The same connection with another timeout (one server only, so pinning is sharing).
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
        let answer = tokio::time::timeout(self.timeout, async {
            let mut conn = self.connection().await.map_err(|_| Broken::Unopened)?;
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
            let mut pubsub = self.client.get_async_pubsub().await.map_err(|_| CallError::Reset)?;
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

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.conn.borrow().clone() {
            return Ok(conn);
        }
        let conn = self.client.get_multiplexed_async_connection().await?;
        *self.conn.borrow_mut() = Some(conn.clone());
        Ok(conn)
    }
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
}
