//! The etcd family on a real server: [`RealEtcd`], the recipes' [`EtcdApi`](super::EtcdApi) over etcd's
//! JSON gateway ([`super::gateway`]) on tokio, for real mode's client processes.
//!
//! It keeps the simulated client's contract ([`EtcdClient`](locksim_sim::backend::etcd::client::EtcdClient),
//! clientv3's behaviour):
//! - a unary call waits at most `call_timeout` (the request context's deadline); one that timed out, or
//!   whose connection broke with the request sent, is [`CallError::Timeout`] — it may have been applied;
//!   one whose connection could not be opened is [`CallError::Reset`] (`Unavailable`, not applied). Each
//!   call is one HTTP request on a connection of its own, so a broken connection never outlives its call.
//! - a watch is a stream of its own (`/v3/watch`); when it breaks (a partition, a restarted server), the
//!   watch is opened again from the revision after the last event delivered, as clientv3's
//!   `watchGrpcStream` resumes its substreams; dropping the [`Watcher`] closes the stream, which cancels
//!   the watch on the server.
//! - keep-alives run the simulated client's loop ([`KeepAlive::start`]): a keep-alive TTL/3 after each
//!   answer, stopped by an answer with TTL 0 or by a TTL without one, on the process's monotonic clock.

use super::gateway;
use locksim_sim::backend::etcd::client::{KeepAlive, Lessor, Watcher};
use locksim_sim::backend::etcd::{EtcdReply, EtcdRequest, LeaseId, WatchResponse};
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::net::CallError;
use serde_json::Value;
use std::future::Future;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A client of one real etcd server's gateway.
#[derive(Clone)]
pub struct RealEtcd {
    ctx: Ctx,
    /// `host:port` of the server's client port.
    addr: String,
    timeout: Duration,
}

/// How long a broken watch stream waits before it is opened again (clientv3 retries with a backoff of
/// its own; the exact wait is not what a lock depends on).
const WATCH_RETRY: Duration = Duration::from_millis(100);

impl RealEtcd {
    pub fn new(ctx: Ctx, addr: &str, timeout: Duration) -> RealEtcd {
        RealEtcd { ctx, addr: addr.into(), timeout }
    }

    /// One unary call and its answer, at most the call timeout.
    pub async fn request(&self, request: EtcdRequest) -> Result<EtcdReply, CallError> {
        let (path, body) = gateway::encode(&request).expect("watches ride RealEtcd::watch");
        let answer = tokio::time::timeout(self.timeout, async {
            let mut response = Response::post(&self.addr, path, &body).await?;
            let text = response.body().await.map_err(|_| CallError::Timeout)?;
            match (response.status, serde_json::from_str::<Value>(&text)) {
                (200, Ok(v)) => Ok(gateway::decode(&request, &v)),
                (_, Ok(v)) if gateway::lease_not_found(&text) => Ok(gateway::decode(&request, &v)),
                // Another error (`etcdserver: request timed out`, no leader): the request may have been
                // applied, as clientv3 tells its caller.
                _ => Err(CallError::Timeout),
            }
        });
        answer.await.unwrap_or(Err(CallError::Timeout))
    }

    /// Watch `key` (or every key under it) from `start_revision` (0: from the next change), once the
    /// server says the watch is created (at most the call timeout).
    pub async fn watch(&self, key: &str, prefix: bool, start_revision: i64) -> Result<Watcher, CallError> {
        let open = tokio::time::timeout(self.timeout, self.open_watch(key, prefix, start_revision));
        let (stream, created) = open.await.unwrap_or(Err(CallError::Timeout))?;
        // A watch "from now" resumes after the revision it was created at.
        let next_revision = if start_revision == 0 { created + 1 } else { start_revision };
        let (tx, events) = mpsc::unbounded_channel();
        let reader = self.ctx.spawn(self.clone().read_watch(stream, key.to_string(), prefix, next_revision, tx));
        Ok(Watcher::streamed(events, reader))
    }

    /// Open a watch stream; the revision of its `created` message.
    async fn open_watch(&self, key: &str, prefix: bool, start_revision: i64) -> Result<(Response, i64), CallError> {
        let body = gateway::watch_create(key, prefix, start_revision);
        let mut stream = Response::post(&self.addr, "/v3/watch", &body).await?;
        if stream.status != 200 {
            return Err(CallError::Timeout);
        }
        let line = stream.next_line().await.map_err(|_| CallError::Timeout)?.ok_or(CallError::Timeout)?;
        let created: Value = serde_json::from_str(&line).map_err(|_| CallError::Timeout)?;
        Ok((stream, gateway::revision(&created["result"])))
    }

    /// Hand each message's events to the watcher, opening the stream again (from the next revision)
    /// whenever it breaks, until the watcher is dropped.
    async fn read_watch(
        self,
        mut stream: Response,
        key: String,
        prefix: bool,
        mut next_revision: i64,
        events: mpsc::UnboundedSender<WatchResponse>,
    ) {
        loop {
            while let Ok(Some(line)) = stream.next_line().await {
                let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
                let (revision, batch) = gateway::watch_message(&message);
                let Some(last) = batch.last() else { continue };
                next_revision = last.kv.mod_revision + 1;
                if events.send(WatchResponse { watch_id: 0, revision, events: batch }).is_err() {
                    return;
                }
            }
            stream = loop {
                tokio::time::sleep(WATCH_RETRY).await;
                if let Ok((stream, _)) = self.open_watch(&key, prefix, next_revision).await {
                    break stream;
                }
            };
        }
    }
}

impl Lessor for RealEtcd {
    fn keep_alive_once(&self, lease: LeaseId) -> impl Future<Output = Result<EtcdReply, CallError>> {
        self.request(EtcdRequest::LeaseKeepAlive { id: lease })
    }

    fn monotonic_ms(&self) -> i64 {
        self.ctx.monotonic_ms()
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> {
        self.ctx.sleep(d)
    }

    fn spawn(&self, task: impl Future<Output = ()> + 'static) -> Background {
        self.ctx.spawn(task)
    }

    fn spawn_detached(&self, task: impl Future<Output = ()> + 'static) {
        tokio::task::spawn_local(task);
    }

    /// A real process's history is the adapter's lines: the end of a keep-alive reaches it only as the
    /// holder's `lost` (with `lost_on = "keepalive"`).
    fn stopped(&self, _: LeaseId, _: &str) {}
}

impl RealEtcd {
    /// Keep `lease` alive in the background (see [`KeepAlive::start`]).
    pub fn keep_alive(&self, lease: LeaseId, ttl: Duration) -> KeepAlive {
        KeepAlive::start(self.clone(), lease, ttl)
    }
}

/// Just enough HTTP/1.1 for the gateway: one POST per connection (`Connection: close`), its answer read
/// whole or, for a watch, line by line as the server streams it.
struct Response {
    status: u16,
    reader: BufReader<TcpStream>,
    /// `Some(n)`: a body of `n` bytes; `None`: chunked.
    length: Option<usize>,
    /// Decoded body bytes not yet handed out.
    pending: Vec<u8>,
    done: bool,
}

impl Response {
    /// Send `body` to `path` and read the status line and headers: [`CallError::Reset`] if no connection
    /// could be opened (nothing was sent), [`CallError::Timeout`] if it broke later (the server may have
    /// got the request).
    async fn post(addr: &str, path: &str, body: &Value) -> Result<Response, CallError> {
        let stream = TcpStream::connect(addr).await.map_err(|_| CallError::Reset)?;
        Response::send(stream, addr, path, body).await.map_err(|_| CallError::Timeout)
    }

    async fn send(mut stream: TcpStream, addr: &str, path: &str, body: &Value) -> io::Result<Response> {
        stream.set_nodelay(true)?;
        let body = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(format!("{head}{body}").as_bytes()).await?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&line))?;
        let mut length = None;
        loop {
            line.clear();
            if reader.read_line(&mut line).await? == 0 {
                return Err(bad("the headers end early"));
            }
            let header = line.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(n) = header.strip_prefix("content-length:") {
                length = Some(n.trim().parse().map_err(|_| bad(&header))?);
            }
        }
        Ok(Response { status, reader, length, pending: Vec::new(), done: false })
    }

    /// The whole body.
    async fn body(&mut self) -> io::Result<String> {
        while self.fill().await? {}
        Ok(String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned())
    }

    /// The body's next line (a streamed message), or `None` at its end.
    async fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Ok(Some(String::from_utf8_lossy(&line).trim().to_string()));
            }
            if !self.fill().await? {
                let rest = std::mem::take(&mut self.pending);
                let rest = String::from_utf8_lossy(&rest).trim().to_string();
                return Ok((!rest.is_empty()).then_some(rest));
            }
        }
    }

    /// Read more of the body into `pending`; false at its end.
    async fn fill(&mut self) -> io::Result<bool> {
        if self.done {
            return Ok(false);
        }
        let n = match self.length {
            Some(n) => {
                self.done = true;
                n
            }
            None => {
                let mut size = String::new();
                self.reader.read_line(&mut size).await?;
                let n = usize::from_str_radix(size.trim(), 16).map_err(|_| bad(&size))?;
                if n == 0 {
                    self.done = true;
                    return Ok(false);
                }
                n
            }
        };
        let start = self.pending.len();
        self.pending.resize(start + n, 0);
        self.reader.read_exact(&mut self.pending[start..]).await?;
        if self.length.is_none() {
            let mut crlf = [0; 2];
            self.reader.read_exact(&mut crlf).await?;
        }
        Ok(true)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("not the gateway's HTTP: {}", what.trim()))
}
