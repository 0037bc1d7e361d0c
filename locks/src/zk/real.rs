//! The ZooKeeper family on a real server: [`RealZk`], the connection of a real client process (real
//! mode) to a real ZooKeeper, speaking jute ([`super::jute`]) over TCP on tokio.
//!
//! It is only the wire: the client above it — pings every half read timeout, `Disconnected` after 2/3·T
//! of silence, re-attaching 1–2 s after each failed attempt, `Expired` learnt on re-attach, watches ended
//! by a state change —
//! is the simulated one ([`ZkClient`](locksim_sim::backend::zk::client::ZkClient) on a
//! [`Host::Real`](locksim_sim::backend::zk::client::Host)), which follows the Java client's
//! `ClientCnxn`. As that client's socket does:
//! - a `Connect` opens a new TCP connection (closing the old one) with a `ConnectRequest`: a new session,
//!   or the old one with its password, and the last zxid the client saw; the server's timeout 0 says
//!   the session has expired, and a server that has applied less than that zxid closes the connection;
//! - each reply's header zxid goes up with it ([`Stamped`]): the client keeps it as `lastZxidSeen`;
//! - requests go out in order with rising xids (a ping is xid −2) and their replies come back in order;
//!   a reader task matches them, and hands watch notifications (xid −1) to the node's router;
//! - a connection that breaks fails every request out on it, and any later one, with
//!   [`CallError::Reset`]: the client is `Disconnected` at once and starts to re-attach, as `ClientCnxn`
//!   does on a socket error — an idle one too, when the server closes it (its reader tells the router);
//!   a request with no reply within its timeout is [`CallError::Timeout`].
//!
//! Watches are not set again on a new connection (`SetWatches`): the client ends every watch when its
//! connection is lost, and the recipes look again, as Curator's do on a state change.

use super::jute::{self, Body, Reader};
use locksim_sim::backend::zk::client::{Link, LinkCall, Router};
use locksim_sim::backend::zk::{SessionId, Stamped, WatchEvent, ZkError, ZkOp, ZkReply, ZkRequest};
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::history::NodeIx;
use locksim_sim::net::CallError;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// One session's connection to a real ZooKeeper server, one TCP connection after another.
pub struct RealZk {
    inner: Rc<Inner>,
}

struct Inner {
    ctx: Ctx,
    /// `host:port` of each server of the connect string (its proxy), as `NodeIx(i)` names them.
    addrs: Vec<String>,
    router: Rc<Router>,
    /// The open connection, if any.
    conn: RefCell<Option<Rc<Conn>>>,
    /// The id the next connection gets.
    next_id: Cell<u32>,
    /// Each session's password, which re-attaching needs.
    passwords: RefCell<BTreeMap<SessionId, Vec<u8>>>,
}

/// A reply as read: its header's zxid, its error code and body.
type Answer = (i64, i32, Vec<u8>);

/// Requests sent on a connection and not yet answered, in order: their xid and who waits for the reply.
type Pending = Rc<RefCell<VecDeque<(i32, oneshot::Sender<Answer>)>>>;

/// One TCP connection carrying one session.
struct Conn {
    id: u32,
    /// Writes happen one at a time, each request behind the one before.
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    /// Cleared by the reader when the stream ends.
    alive: Rc<Cell<bool>>,
    next_xid: Cell<i32>,
    /// Read the replies and notifications; dropped with the connection.
    _reader: Background,
}

impl RealZk {
    /// A connection to one of the servers of `connect` (`host:port,host:port…`), handing notifications to
    /// `router`.
    pub fn new(ctx: Ctx, connect: &str, router: Rc<Router>) -> RealZk {
        let inner = Inner {
            ctx,
            addrs: connect.split(',').map(str::to_string).collect(),
            router,
            conn: RefCell::default(),
            next_id: Cell::new(1),
            passwords: RefCell::default(),
        };
        RealZk { inner: Rc::new(inner) }
    }
}

impl Link for RealZk {
    fn call_on(&self, server: NodeIx, conn: Option<u32>, request: ZkRequest, timeout: Duration) -> LinkCall {
        let inner = self.inner.clone();
        Box::pin(async move {
            let call = async {
                match request {
                    ZkRequest::Connect { requested_ms, session, last_zxid } => {
                        inner.connect(server, requested_ms, session, last_zxid).await
                    }
                    ZkRequest::Op { session: _, op } => inner.op(conn, op).await,
                }
            };
            tokio::time::timeout(timeout, call).await.unwrap_or(Err(CallError::Timeout))
        })
    }
}

impl Inner {
    /// Open a new connection to `server` and open or re-attach a session on it.
    async fn connect(
        &self,
        server: NodeIx,
        requested_ms: i64,
        session: Option<SessionId>,
        last_zxid: u64,
    ) -> Result<(Stamped, u32), CallError> {
        // The old connection is closed first, as the Java client closes its socket before reconnecting.
        self.conn.borrow_mut().take();
        let addr = &self.addrs[server.0 as usize];
        let mut stream = TcpStream::connect(addr).await.map_err(|_| CallError::Reset)?;
        let password = session.and_then(|s| self.passwords.borrow().get(&s).cloned());
        let old = session.map(|s| (s as i64, password.as_deref().unwrap_or(&[0; 16])));
        let request = Body::connect(requested_ms as i32, old, last_zxid as i64);
        let answer = async {
            stream.set_nodelay(true)?;
            write_frame(&mut stream, &request.0).await?;
            let frame = read_frame(&mut stream).await?;
            Reader(&frame).connected()
        };
        let (timeout_ms, id, password) = answer.await.map_err(|_| CallError::Reset)?;
        let conn_id = self.next_id.get();
        self.next_id.set(conn_id + 1);
        if timeout_ms <= 0 {
            // The server no longer knows the session: it closes the connection.
            return Ok((Stamped { zxid: 0, reply: ZkReply::Error(ZkError::SessionExpired) }, conn_id));
        }
        let session = id as SessionId;
        self.passwords.borrow_mut().insert(session, password);
        let (read, write) = stream.into_split();
        let (pending, alive) = (Rc::default(), Rc::new(Cell::new(true)));
        let reading = Reading {
            pending: Rc::clone(&pending),
            alive: Rc::clone(&alive),
            router: self.router.clone(),
            session,
            conn: conn_id,
        };
        let reader = self.ctx.spawn(reading.run(read));
        let conn = Conn {
            id: conn_id,
            writer: tokio::sync::Mutex::new(write),
            pending,
            alive,
            next_xid: Cell::new(1),
            _reader: reader,
        };
        *self.conn.borrow_mut() = Some(Rc::new(conn));
        let reply = ZkReply::Connected { session, timeout_ms: i64::from(timeout_ms) };
        Ok((Stamped { zxid: 0, reply }, conn_id))
    }

    /// Send `op` on connection `conn` (it must be the open one) and wait for its reply.
    async fn op(&self, conn: Option<u32>, op: ZkOp) -> Result<(Stamped, u32), CallError> {
        let open = self.conn.borrow().clone().filter(|c| Some(c.id) == conn && c.alive.get());
        let open = open.ok_or(CallError::Reset)?;
        let (kind, body) = jute::encode(&op);
        let (tx, rx) = oneshot::channel();
        {
            let mut writer = open.writer.lock().await;
            let xid = match op {
                ZkOp::Ping => jute::XID_PING,
                _ => {
                    let xid = open.next_xid.get();
                    open.next_xid.set(xid + 1);
                    xid
                }
            };
            let mut frame = Body::default().int(xid).int(kind).0;
            frame.extend(body.0);
            open.pending.borrow_mut().push_back((xid, tx));
            if write_frame(&mut *writer, &frame).await.is_err() {
                self.broken(&open);
                return Err(CallError::Reset);
            }
        }
        // The sender is dropped when the connection breaks: the request may have been applied, but the
        // client learns of it as a lost connection.
        let (zxid, code, body) = rx.await.map_err(|_| CallError::Reset)?;
        match jute::decode(&op, code, &body) {
            Ok(Ok(reply)) => Ok((Stamped { zxid: zxid.max(0) as u64, reply }, open.id)),
            // An error the model does not name (`ConnectionLoss`, `MarshallingError`): no answer.
            Ok(Err(_)) | Err(_) => Err(CallError::Timeout),
        }
    }

    /// `open` broke: it is closed, and every request out on it fails.
    fn broken(&self, open: &Conn) {
        let mut conn = self.conn.borrow_mut();
        if conn.as_ref().is_some_and(|c| c.id == open.id) {
            conn.take();
        }
        open.pending.borrow_mut().clear();
    }
}

/// What a connection's reader hands its frames to.
struct Reading {
    pending: Pending,
    alive: Rc<Cell<bool>>,
    router: Rc<Router>,
    session: SessionId,
    /// Its connection's id.
    conn: u32,
}

impl Reading {
    /// Read a connection's frames: each reply to the request waiting at the front, each notification to
    /// the router. At the end of the stream the connection is dead, every waiting request fails (its
    /// sender dropped), and the router tells the session, idle or not (the Java client's send thread
    /// reads its socket all along: a server that closes the connection is noticed then).
    async fn run(self, mut read: OwnedReadHalf) {
        while let Ok(frame) = read_frame(&mut read).await {
            let mut r = Reader(&frame);
            let Ok((xid, zxid, code)) = r.reply_header() else { break };
            if xid == jute::XID_NOTIFICATION {
                if let Ok((kind, _state, path)) = r.watcher_event() {
                    if let Some(event) = jute::event_type(kind) {
                        self.router.deliver(WatchEvent { session: self.session, path, event });
                    }
                }
                continue;
            }
            let waiting = self.pending.borrow_mut().pop_front();
            match waiting {
                Some((sent, reply)) if sent == xid => {
                    let _ = reply.send((zxid, code, r.0.to_vec()));
                }
                // Out of order: not the protocol this client speaks.
                _ => break,
            }
        }
        self.alive.set(false);
        self.pending.borrow_mut().clear();
        // A millisecond on, as the simulated client hands over a close its paused process finds on
        // resuming: the application's next step first (kazoo on a real ZooKeeper: the resumed holder's
        // write came before SUSPENDED in 8 of 10 runs).
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.router.connection_ended(self.session, self.conn);
    }
}

async fn write_frame(stream: &mut (impl AsyncWriteExt + Unpin), payload: &[u8]) -> io::Result<()> {
    let mut frame = (payload.len() as i32).to_be_bytes().to_vec();
    frame.extend(payload);
    stream.write_all(&frame).await
}

async fn read_frame(stream: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Vec<u8>> {
    let mut len = [0; 4];
    stream.read_exact(&mut len).await?;
    let mut frame = vec![0; i32::from_be_bytes(len).max(0) as usize];
    stream.read_exact(&mut frame).await?;
    Ok(frame)
}
