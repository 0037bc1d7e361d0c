//! A minimal ZooKeeper client on the wire (jute, the ZooKeeper 3.8 protocol): connect and re-attach,
//! the requests the recipes send, and watch events read off the same connection. Written out rather
//! than taken from a crate because conformance must decide when the session is renewed: a client
//! library pings in the background, and a session that never goes quiet never expires.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// Request types (`ZooDefs.OpCode`).
pub const CREATE: i32 = 1;
pub const CREATE2: i32 = 15;
pub const DELETE: i32 = 2;
pub const EXISTS: i32 = 3;
pub const GET_DATA: i32 = 4;
pub const SET_DATA: i32 = 5;
pub const GET_CHILDREN2: i32 = 12;
pub const PING: i32 = 11;
pub const REMOVE_WATCHES: i32 = 18;
pub const CHECK: i32 = 13;
pub const MULTI: i32 = 14;
pub const SYNC: i32 = 9;
/// A `multi`'s result entry for an operation that failed or was not applied (`OpCode.error`).
pub const ERROR: i32 = -1;
pub const CLOSE_SESSION: i32 = -11;
pub const SET_WATCHES: i32 = 101;

/// A request body, written as jute writes it (big-endian, length-prefixed strings and buffers).
#[derive(Default)]
pub struct Body(Vec<u8>);

impl Body {
    pub fn int(mut self, v: i32) -> Self {
        self.0.extend(v.to_be_bytes());
        self
    }

    pub fn long(mut self, v: i64) -> Self {
        self.0.extend(v.to_be_bytes());
        self
    }

    pub fn bool(mut self, v: bool) -> Self {
        self.0.push(u8::from(v));
        self
    }

    pub fn bytes(self, v: &[u8]) -> Self {
        let mut b = self.int(v.len() as i32);
        b.0.extend(v);
        b
    }

    pub fn str(self, v: &str) -> Self {
        self.bytes(v.as_bytes())
    }

    /// `ZooDefs.Ids.OPEN_ACL_UNSAFE`: everyone may do everything.
    pub fn open_acl(self) -> Self {
        self.int(1).int(31).str("world").str("anyone")
    }
}

/// A reply body, read back.
pub struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    /// A `MultiHeader`: the operation's type, whether this is the end marker, and its error code.
    pub fn multi_header(&mut self) -> std::io::Result<(i32, bool, i32)> {
        let kind = self.int()?;
        let done = self.take(1)?[0] != 0;
        Ok((kind, done, self.int()?))
    }

    fn take(&mut self, n: usize) -> std::io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a short ZooKeeper reply"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub fn int(&mut self) -> std::io::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn long(&mut self) -> std::io::Result<i64> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let n = self.int()?;
        Ok(if n < 0 { Vec::new() } else { self.take(n as usize)?.to_vec() })
    }

    pub fn str(&mut self) -> std::io::Result<String> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
}

/// The fields of a znode's `Stat`, in wire order.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub version: i32,
    pub cversion: i32,
    pub ephemeral_owner: i64,
    pub num_children: i32,
    pub pzxid: i64,
}

impl Reader<'_> {
    pub fn stat(&mut self) -> std::io::Result<Stat> {
        let (czxid, mzxid) = (self.long()?, self.long()?);
        let (_ctime, _mtime) = (self.long()?, self.long()?);
        let (version, cversion, _aversion) = (self.int()?, self.int()?, self.int()?);
        let ephemeral_owner = self.long()?;
        let (_data_length, num_children) = (self.int()?, self.int()?);
        let pzxid = self.long()?;
        Ok(Stat { czxid, mzxid, version, cversion, ephemeral_owner, num_children, pzxid })
    }
}

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
    /// The last zxid a reply carried: a new connection's `SetWatches` fires what changed after it.
    last_zxid: i64,
}

/// A session the server no longer knows (the connect answer's timeout is 0).
pub struct Expired;

impl Conn {
    /// Open a session (`session` None) with `timeout_ms`, or re-attach to one.
    pub fn connect(
        addr: SocketAddr,
        timeout_ms: i32,
        session: Option<(i64, Vec<u8>)>,
    ) -> std::io::Result<Result<Conn, Expired>> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(super::ANSWER_TIMEOUT))?;
        let (id, password) = session.unwrap_or((0, vec![0; 16]));
        let request = Body::default().int(0).long(0).int(timeout_ms).long(id).bytes(&password).bool(false);
        write_frame(&mut stream, &request.0)?;
        let frame = read_frame(&mut stream)?;
        let mut r = Reader(&frame);
        let (_protocol, timeout) = (r.int()?, r.int()?);
        let (session, password) = (r.long()?, r.bytes()?);
        if timeout <= 0 {
            return Ok(Err(Expired));
        }
        let (events, watches, last_zxid) = (Vec::new(), Watches::default(), 0);
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
