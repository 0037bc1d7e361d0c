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

use super::{gateway, http};
use locksim_sim::backend::etcd::client::{Balancer, KeepAlive, Lessor, Watcher};
use locksim_sim::backend::etcd::{EtcdReply, EtcdRequest, LeaseId, WatchResponse};
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::net::CallError;
use serde_json::Value;
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A client of a real etcd's gateway: one member's, or a cluster's, its calls spread over the members
/// as the simulated client spreads them ([`Balancer`]).
#[derive(Clone)]
pub struct RealEtcd {
    ctx: Ctx,
    /// `host:port` of each member's client port (its proxy).
    endpoints: Rc<[String]>,
    /// Which member each call goes to: the turn and the streams start at one drawn in a cluster, and
    /// a member whose connection cannot be opened is left.
    balancer: Rc<Balancer>,
    timeout: Duration,
}

/// How long a broken watch stream waits before it is opened again (clientv3 retries with a backoff of
/// its own; the exact wait is not what a lock depends on).
const WATCH_RETRY: Duration = Duration::from_millis(100);

impl RealEtcd {
    /// A client of the members at `endpoints` (each `host:port`), its calls starting on `first`, each
    /// waiting up to `timeout`.
    pub fn new(ctx: Ctx, endpoints: Rc<[String]>, first: usize, timeout: Duration) -> RealEtcd {
        let balancer = Rc::new(Balancer::new(endpoints.len(), first));
        RealEtcd { ctx, endpoints, balancer, timeout }
    }

    /// POST to the streams' member (`streamed`: a watch or a keep-alive), else to the member whose turn
    /// it is; one that cannot be reached is left.
    async fn post(&self, path: &str, body: &Value, streamed: bool) -> Result<Response, CallError> {
        let now_ms = self.ctx.monotonic_ms();
        let at = if streamed { self.balancer.stream() } else { self.balancer.unary(now_ms) };
        let response = Response::post(&self.endpoints[at], path, body).await;
        if let Err(CallError::Reset) = response {
            self.balancer.failed(at, self.ctx.monotonic_ms());
        }
        response
    }

    /// One unary call and its answer, at most the call timeout.
    pub async fn request(&self, request: EtcdRequest) -> Result<EtcdReply, CallError> {
        let (path, body) = gateway::encode(&request).expect("watches ride RealEtcd::watch");
        let answer = tokio::time::timeout(self.timeout, async {
            let streamed = matches!(request, EtcdRequest::LeaseKeepAlive { .. });
            let mut response = self.post(path, &body, streamed).await?;
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
        let mut stream = self.post("/v3/watch", &body, true).await?;
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

/// One POST on a connection of its own, its answer decoded by [`http::Response`]: read whole or, for
/// a watch, line by line as the server streams it.
struct Response {
    status: u16,
    stream: TcpStream,
    answer: http::Response,
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
        stream.write_all(&http::post(addr, path, &body.to_string())).await?;
        let mut answer = http::Response::default();
        let status = loop {
            match answer.status() {
                Some(status) => break status,
                None => fill(&mut stream, &mut answer).await?,
            }
        };
        Ok(Response { status, stream, answer })
    }

    /// The whole body.
    async fn body(&mut self) -> io::Result<String> {
        while !self.answer.is_done() {
            fill(&mut self.stream, &mut self.answer).await?;
        }
        Ok(self.answer.take_body())
    }

    /// The body's next line (a streamed message), or `None` at its end.
    async fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(line) = self.answer.next_line() {
                return Ok(Some(line));
            }
            if self.answer.is_done() {
                return Ok(None);
            }
            fill(&mut self.stream, &mut self.answer).await?;
        }
    }
}

/// Read what the connection has into `answer`.
async fn fill(stream: &mut TcpStream, answer: &mut http::Response) -> io::Result<()> {
    let mut buf = [0; 4096];
    match stream.read(&mut buf).await? {
        0 => answer.end(),
        n => answer.feed(&buf[..n]),
    }
}
