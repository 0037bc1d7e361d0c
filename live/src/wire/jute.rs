//! A minimal ZooKeeper client on the wire (jute, the ZooKeeper 3.8 protocol): connect and re-attach,
//! the requests the recipes send, and watch events read off the same connection. Written out rather
//! than taken from a crate because conformance must decide when the session is renewed: a client
//! library pings in the background, and a session that never goes quiet never expires.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

pub use locksim_locks::zk::jute::{
    error, flags, Body, Reader, Stat, CHECK, CLOSE_SESSION, CREATE, CREATE2, DELETE, ERROR, EXISTS, GET_CHILDREN2,
    GET_DATA, MULTI, PING, REMOVE_WATCHES, SET_DATA, SET_WATCHES, SYNC,
};

/// A watch event (`WatcherEvent`): its type and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: i32,
    pub path: String,
}

/// The watches a client has set and not yet seen fire (the Java client's `ZKWatchManager`), which it
/// sets again on a new connection (`SetWatches`): a server that restarted has forgotten them.
#[derive(Default, Clone)]
pub struct Watches {
    pub data: std::collections::BTreeSet<String>,
    pub exist: std::collections::BTreeSet<String>,
    pub child: std::collections::BTreeSet<String>,
}

impl Watches {
    /// A watch event spends the watches it fires (`ZKWatchManager.materialize`).
    fn fired(&mut self, event: &Event) {
        const CREATED: i32 = 1;
        const DELETED: i32 = 2;
        const DATA_CHANGED: i32 = 3;
        const CHILDREN_CHANGED: i32 = 4;
        match event.kind {
            CREATED | DATA_CHANGED => {
                self.data.remove(&event.path);
                self.exist.remove(&event.path);
            }
            CHILDREN_CHANGED => {
                self.child.remove(&event.path);
            }
            DELETED => self.forget(&event.path),
            _ => {}
        }
    }

    /// `removeWatches(path, Any)`.
    pub fn forget(&mut self, path: &str) {
        self.data.remove(path);
        self.exist.remove(path);
        self.child.remove(path);
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty() && self.exist.is_empty() && self.child.is_empty()
    }
}

/// One connection carrying one session.
pub struct Conn {
    stream: TcpStream,
    pub session: i64,
    /// The negotiated session timeout.
    pub timeout: i32,
    pub password: Vec<u8>,
    xid: i32,
    /// Watch events read so far and not yet taken.
    pub events: Vec<Event>,
    pub watches: Watches,
    /// The last zxid a reply carried (`lastZxidSeen`): a new connection's `SetWatches` fires what changed
    /// after it.
    pub last_zxid: i64,
}

/// A session the server no longer knows (the connect answer's timeout is 0).
pub struct Expired;

impl Conn {
    /// Open a session (`session` None) with `timeout_ms`, or re-attach to one; `last_zxid`: the last
    /// zxid the client saw (`lastZxidSeen`; 0 for a new one).
    pub fn connect(
        addr: SocketAddr,
        timeout_ms: i32,
        session: Option<(i64, Vec<u8>)>,
        last_zxid: i64,
    ) -> std::io::Result<Result<Conn, Expired>> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(super::ANSWER_TIMEOUT))?;
        let old = session.as_ref().map(|(id, password)| (*id, password.as_slice()));
        let request = Body::connect(timeout_ms, old, last_zxid);
        write_frame(&mut stream, &request.0)?;
        let frame = read_frame(&mut stream)?;
        let (timeout, session, password) = Reader(&frame).connected()?;
        if timeout <= 0 {
            return Ok(Err(Expired));
        }
        let (events, watches) = (Vec::new(), Watches::default());
        Ok(Ok(Conn { stream, session, timeout, password, xid: 0, events, watches, last_zxid }))
    }

    /// Send a request and wait for its answer: the error code (0: none) and the body. Watch events that
    /// arrive first are kept in `events`.
    pub fn call(&mut self, op: i32, body: Body) -> std::io::Result<(i32, Vec<u8>)> {
        let xid = match op {
            PING => -2,
            SET_WATCHES => -8,
            _ => {
                self.xid += 1;
                self.xid
            }
        };
        let mut frame = Body::default().int(xid).int(op).0;
        frame.extend(body.0);
        write_frame(&mut self.stream, &frame)?;
        loop {
            let frame = read_frame(&mut self.stream)?;
            let mut r = Reader(&frame);
            let (got, zxid, err) = (r.int()?, r.long()?, r.int()?);
            if zxid > 0 {
                self.last_zxid = zxid;
            }
            if got == -1 {
                let (kind, _state, path) = (r.int()?, r.int()?, r.str()?);
                self.heard(Event { kind, path });
                continue;
            }
            if got == xid {
                return Ok((err, r.0.to_vec()));
            }
        }
    }
}

impl Conn {
    fn heard(&mut self, event: Event) {
        self.watches.fired(&event);
        self.events.push(event);
    }

    /// Carry a session's client-side state over to a new connection, and set its watches again
    /// (`SetWatches`, as the Java client does on every reconnect).
    pub fn resume(&mut self, old: Conn) -> std::io::Result<()> {
        (self.events, self.watches, self.last_zxid) = (old.events, old.watches, old.last_zxid);
        if self.watches.is_empty() {
            return Ok(());
        }
        let list = |body: Body, paths: &std::collections::BTreeSet<String>| {
            paths.iter().fold(body.int(paths.len() as i32), |b, p| b.str(p))
        };
        let body = list(
            list(list(Body::default().long(self.last_zxid), &self.watches.data), &self.watches.exist),
            &self.watches.child,
        );
        self.call(SET_WATCHES, body).map(drop)
    }

    /// Read what the server already sent on a connection about to be dropped (it restarted, or closed
    /// it): a real client reads its socket all the time, so watch events sent before the end were
    /// delivered.
    pub fn drain(&mut self) {
        let _ = self.stream.set_read_timeout(Some(std::time::Duration::from_millis(20)));
        while let Ok(frame) = read_frame(&mut self.stream) {
            let mut r = Reader(&frame);
            if let (Ok(-1), Ok(_), Ok(_)) = (r.int(), r.long(), r.int()) {
                if let (Ok(kind), Ok(_), Ok(path)) = (r.int(), r.int(), r.str()) {
                    self.heard(Event { kind, path });
                }
            }
        }
    }
}

fn write_frame(stream: &mut TcpStream, payload: &[u8]) -> std::io::Result<()> {
    let mut frame = (payload.len() as i32).to_be_bytes().to_vec();
    frame.extend(payload);
    stream.write_all(&frame)
}

fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0; 4];
    stream.read_exact(&mut len)?;
    let mut frame = vec![0; i32::from_be_bytes(len).max(0) as usize];
    stream.read_exact(&mut frame)?;
    Ok(frame)
}

/// A reply body as a reader.
pub fn reader(body: &[u8]) -> Reader<'_> {
    Reader(body)
}
