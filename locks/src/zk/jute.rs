//! ZooKeeper's wire format (jute, the ZooKeeper 3.8 protocol): the opcodes, request bodies, reply
//! readers, and the recipes' operations ([`ZkOp`]) as requests and their answers ([`ZkReply`]). Real
//! mode's client ([`super::real`]) and the conformance run against the real server both speak it.
//!
//! Jute writes big-endian integers, and strings and buffers as a length (`-1`: null) and the bytes.

use locksim_sim::backend::zk::{CreateMode, EventType, Stat as ZkStat, TxnOp, ZkError, ZkOp, ZkReply};

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

/// The xids the protocol reserves: a watch notification, a ping and its answer, `SetWatches`.
pub const XID_NOTIFICATION: i32 = -1;
pub const XID_PING: i32 = -2;
pub const XID_SET_WATCHES: i32 = -8;

/// `WatcherType.Any`, for `removeWatches`.
const WATCHER_ANY: i32 = 3;

/// A request body, written as jute writes it (big-endian, length-prefixed strings and buffers).
#[derive(Default)]
pub struct Body(pub Vec<u8>);

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

    /// A `ConnectRequest`: open a session (`session` None) asking for `timeout_ms`, or re-attach to one
    /// with its password; `last_zxid` is the last zxid the client saw (`lastZxidSeen`).
    pub fn connect(timeout_ms: i32, session: Option<(i64, &[u8])>, last_zxid: i64) -> Body {
        let (id, password) = session.unwrap_or((0, &[0; 16]));
        Body::default().int(0).long(last_zxid).int(timeout_ms).long(id).bytes(password).bool(false)
    }
}

/// A reply body, read back.
pub struct Reader<'a>(pub &'a [u8]);

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

    pub fn stat(&mut self) -> std::io::Result<Stat> {
        let (czxid, mzxid) = (self.long()?, self.long()?);
        let (_ctime, _mtime) = (self.long()?, self.long()?);
        let (version, cversion, _aversion) = (self.int()?, self.int()?, self.int()?);
        let ephemeral_owner = self.long()?;
        let (_data_length, num_children) = (self.int()?, self.int()?);
        let pzxid = self.long()?;
        Ok(Stat { czxid, mzxid, version, cversion, ephemeral_owner, num_children, pzxid })
    }

    /// A `ConnectResponse`: the negotiated timeout (0: the session is gone), the session and its
    /// password.
    pub fn connected(&mut self) -> std::io::Result<(i32, i64, Vec<u8>)> {
        let (_protocol, timeout) = (self.int()?, self.int()?);
        Ok((timeout, self.long()?, self.bytes()?))
    }

    /// A `ReplyHeader`: the xid answered, the zxid, the error code (0: none).
    pub fn reply_header(&mut self) -> std::io::Result<(i32, i64, i32)> {
        Ok((self.int()?, self.long()?, self.int()?))
    }

    /// A `WatcherEvent`: its type, the connection state, the path.
    pub fn watcher_event(&mut self) -> std::io::Result<(i32, i32, String)> {
        Ok((self.int()?, self.int()?, self.str()?))
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

impl From<Stat> for ZkStat {
    fn from(s: Stat) -> ZkStat {
        ZkStat {
            czxid: s.czxid as u64,
            mzxid: s.mzxid as u64,
            pzxid: s.pzxid as u64,
            version: s.version,
            cversion: s.cversion,
            ephemeral_owner: s.ephemeral_owner as u64,
            num_children: s.num_children,
        }
    }
}

/// `CreateMode`'s flags.
pub fn flags(mode: CreateMode) -> i32 {
    match mode {
        CreateMode::Persistent => 0,
        CreateMode::Ephemeral => 1,
        CreateMode::PersistentSequential => 2,
        CreateMode::EphemeralSequential => 3,
    }
}

/// The `KeeperException.Code` values the model names (`None`: another one).
pub fn error(code: i32) -> Option<ZkError> {
    Some(match code {
        -101 => ZkError::NoNode,
        -110 => ZkError::NodeExists,
        -103 => ZkError::BadVersion,
        -111 => ZkError::NotEmpty,
        -108 => ZkError::NoChildrenForEphemerals,
        -112 => ZkError::SessionExpired,
        -121 => ZkError::NoWatcher,
        _ => return None,
    })
}

/// A watch notification's type (`None`: a connection-state event, `EventType.None`).
pub fn event_type(kind: i32) -> Option<EventType> {
    Some(match kind {
        1 => EventType::NodeCreated,
        2 => EventType::NodeDeleted,
        3 => EventType::NodeDataChanged,
        4 => EventType::NodeChildrenChanged,
        _ => return None,
    })
}

/// `op` as a request: its type and body (the Java client's: `create2` for a create, `getChildren2`).
pub fn encode(op: &ZkOp) -> (i32, Body) {
    let b = Body::default();
    match op {
        ZkOp::Ping => (PING, b),
        ZkOp::Create { path, data, mode } => (CREATE2, b.str(path).str(data).open_acl().int(flags(*mode))),
        ZkOp::Delete { path, version } => (DELETE, b.str(path).int(*version)),
        ZkOp::SetData { path, data, version } => (SET_DATA, b.str(path).str(data).int(*version)),
        ZkOp::Exists { path, watch } => (EXISTS, b.str(path).bool(*watch)),
        ZkOp::GetData { path, watch } => (GET_DATA, b.str(path).bool(*watch)),
        ZkOp::GetChildren { path, watch } => (GET_CHILDREN2, b.str(path).bool(*watch)),
        ZkOp::RemoveWatches { path } => (REMOVE_WATCHES, b.str(path).int(WATCHER_ANY)),
        ZkOp::Multi(ops) => (MULTI, multi(ops)),
        ZkOp::Sync { path } => (SYNC, b.str(path)),
        ZkOp::Close => (CLOSE_SESSION, b),
    }
}

/// A `MultiRequest`: each operation behind its header, then the end marker.
fn multi(ops: &[TxnOp]) -> Body {
    let body = ops.iter().fold(Body::default(), |b, op| match op {
        TxnOp::Create { path, data, mode } => {
            b.int(CREATE).bool(false).int(-1).str(path).str(data).open_acl().int(flags(*mode))
        }
        TxnOp::Delete { path, version } => b.int(DELETE).bool(false).int(-1).str(path).int(*version),
        TxnOp::SetData { path, data, version } => b.int(SET_DATA).bool(false).int(-1).str(path).str(data).int(*version),
        TxnOp::Check { path, version } => b.int(CHECK).bool(false).int(-1).str(path).int(*version),
    });
    body.int(-1).bool(true).int(-1)
}

/// The answer to `op` from its reply's error code and body, as the simulated server answers: an error
/// code it names is [`ZkReply::Error`] (but `exists` of a missing node is `Exists(None)`); one it does
/// not name is `Err` with the code.
pub fn decode(op: &ZkOp, code: i32, body: &[u8]) -> std::io::Result<Result<ZkReply, i32>> {
    let mut r = Reader(body);
    if code != 0 {
        return Ok(match (op, error(code)) {
            (ZkOp::Exists { .. }, Some(ZkError::NoNode)) => Ok(ZkReply::Exists(None)),
            (ZkOp::Multi(_), Some(_)) => decode_multi(&mut r)?,
            (_, Some(e)) => Ok(ZkReply::Error(e)),
            (_, None) => Err(code),
        });
    }
    Ok(Ok(match op {
        ZkOp::Ping => ZkReply::Pong,
        ZkOp::Create { .. } => ZkReply::Created { path: r.str()?, stat: r.stat()?.into() },
        ZkOp::Delete { .. } => ZkReply::Deleted,
        ZkOp::SetData { .. } => ZkReply::DataSet(r.stat()?.into()),
        ZkOp::Exists { .. } => ZkReply::Exists(Some(r.stat()?.into())),
        ZkOp::GetData { .. } => {
            ZkReply::Data { data: String::from_utf8_lossy(&r.bytes()?).into(), stat: r.stat()?.into() }
        }
        ZkOp::GetChildren { .. } => {
            let n = r.int()?.max(0);
            let children = (0..n).map(|_| r.str()).collect::<std::io::Result<Vec<_>>>()?;
            ZkReply::Children { children, stat: r.stat()?.into() }
        }
        ZkOp::RemoveWatches { .. } => ZkReply::WatchesRemoved,
        ZkOp::Multi(_) => return decode_multi(&mut r),
        ZkOp::Sync { .. } => ZkReply::Synced { path: r.str()? },
        ZkOp::Close => ZkReply::Closed,
    }))
}

/// A `MultiResponse`: every operation's result, or — nothing applied — the first that failed. Operations
/// before the one that failed answer 0 (rolled back), those after it `RUNTIMEINCONSISTENCY` (-2).
fn decode_multi(r: &mut Reader) -> std::io::Result<Result<ZkReply, i32>> {
    let mut results = Vec::new();
    loop {
        let (kind, done, _) = r.multi_header()?;
        if done {
            break;
        }
        results.push(match kind {
            ERROR => Err(r.int()?),
            // ZooKeeper 3.8 answers a create in a multi with its path alone (`CreateResult`).
            CREATE => Ok(ZkReply::CreatedPath { path: r.str()? }),
            CREATE2 => {
                let path = r.str()?;
                r.stat()?;
                Ok(ZkReply::CreatedPath { path })
            }
            DELETE => Ok(ZkReply::Deleted),
            SET_DATA => Ok(ZkReply::DataSet(r.stat()?.into())),
            CHECK => Ok(ZkReply::Checked),
            other => {
                let what = format!("a multi result of type {other}");
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, what));
            }
        });
    }
    let failed = results
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.as_ref().err().filter(|e| **e != 0 && **e != -2).map(|e| (i, *e)));
    Ok(match failed {
        Some((i, e)) => error(e).map(|named| ZkReply::Multi(Err((i, named)))).ok_or(e),
        None => Ok(ZkReply::Multi(Ok(results.into_iter().map(|r| r.unwrap_or(ZkReply::Checked)).collect()))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_bytes(czxid: i64) -> Vec<u8> {
        let b = Body::default().long(czxid).long(czxid).long(0).long(0).int(0).int(0).int(0).long(7);
        b.int(0).int(0).long(czxid).0
    }

    #[test]
    fn a_protected_create_is_create2_and_answers_its_path_and_stat() {
        let op =
            ZkOp::Create { path: "/l/_c_1-lock-".into(), data: String::new(), mode: CreateMode::EphemeralSequential };
        let (kind, body) = encode(&op);
        assert_eq!(kind, CREATE2);
        let expected = Body::default().str("/l/_c_1-lock-").str("").open_acl().int(3).0;
        assert_eq!(body.0, expected);
        let mut reply = Body::default().str("/l/_c_1-lock-0000000004").0;
        reply.extend(stat_bytes(42));
        let created = decode(&op, 0, &reply).unwrap().unwrap();
        let ZkReply::Created { path, stat } = created else { panic!("{created:?}") };
        assert_eq!((path.as_str(), stat.czxid, stat.ephemeral_owner), ("/l/_c_1-lock-0000000004", 42, 7));
    }

    #[test]
    fn exists_of_a_missing_node_is_none_and_other_errors_are_named() {
        let exists = ZkOp::Exists { path: "/x".into(), watch: true };
        assert_eq!(decode(&exists, -101, &[]).unwrap(), Ok(ZkReply::Exists(None)));
        let delete = ZkOp::Delete { path: "/x".into(), version: -1 };
        assert_eq!(decode(&delete, -101, &[]).unwrap(), Ok(ZkReply::Error(ZkError::NoNode)));
        assert_eq!(decode(&delete, -4, &[]).unwrap(), Err(-4), "ConnectionLoss is no server answer");
    }

    #[test]
    fn a_failed_multi_names_its_first_failing_operation() {
        let op = ZkOp::Multi(vec![
            TxnOp::Check { path: "/a".into(), version: 1 },
            TxnOp::Delete { path: "/b".into(), version: -1 },
        ]);
        let reply = Body::default().int(ERROR).bool(false).int(-103).int(-103);
        let reply = reply.int(ERROR).bool(false).int(-2).int(-2).int(-1).bool(true).int(-1).0;
        assert_eq!(decode(&op, -103, &reply).unwrap(), Ok(ZkReply::Multi(Err((0, ZkError::BadVersion)))));
    }

    #[test]
    fn children_come_with_the_parents_stat() {
        let op = ZkOp::GetChildren { path: "/l".into(), watch: true };
        let mut reply = Body::default().int(2).str("lock-1").str("lock-2").0;
        reply.extend(stat_bytes(3));
        let answer = decode(&op, 0, &reply).unwrap().unwrap();
        let ZkReply::Children { children, .. } = answer else { panic!("{answer:?}") };
        assert_eq!(children, ["lock-1", "lock-2"]);
    }
}
