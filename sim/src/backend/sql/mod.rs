//! A simulated relational database with PostgreSQL 15's locking semantics.
//!
//! Modelled behaviour, from the PostgreSQL 15 documentation (§13.3 explicit locking, §20.3 connection
//! settings, §9.27.10 advisory lock functions):
//! - Tables of rows keyed by a text primary key, and sequences (`nextval` is not transactional).
//! - Sessions and transactions: `BEGIN` … `COMMIT`/`ROLLBACK`, or one statement at a time (autocommit).
//!   An error inside a transaction aborts it: every statement but `ROLLBACK`/`COMMIT` fails until then.
//! - Row locks: `SELECT … FOR UPDATE`, `UPDATE`, `DELETE` and `INSERT` lock the row until the
//!   transaction ends; a statement that needs a row another transaction has locked waits (first come,
//!   first served) until that transaction ends or its own `lock_timeout` passes. An `INSERT` of a key whose
//!   row another open transaction inserted waits for it too, then fails with a unique violation if that
//!   transaction committed.
//! - `UPDATE … WHERE` checks its conditions on the row as it is once locked (READ COMMITTED re-check), with
//!   `now()` the server's wall clock (a `clock-jump` moves it). Timers — `lock_timeout`,
//!   `idle_in_transaction_session_timeout` and the kernel's TCP keep-alive — measure intervals on the
//!   monotonic clock.
//! - Session advisory locks: `pg_advisory_lock` waits, `pg_try_advisory_lock` does not; both count up
//!   when the session already holds the key, and `pg_advisory_unlock` counts down.
//! - Session death rolls back its transaction and frees its locks: the client closing its connection,
//!   TCP keep-alive finding the peer dead (`tcp_keepalives_idle` of silence, then `tcp_keepalives_count`
//!   probes `tcp_keepalives_interval` apart), or `idle_in_transaction_session_timeout`.
//! - A statement that is waiting when its client goes away keeps waiting (the server notices only when
//!   it answers): once it runs, an autocommit statement is committed and the session then ends.
//!
//! Not modelled: MVCC snapshots (a plain `SELECT` sees uncommitted changes; no recipe reads a row it has
//! not locked while another transaction writes it), deadlock detection (recipes lock one thing), and
//! `statement_timeout`.
//!
//! Clients talk to it over connections that behave as TCP streams: statements and results are stream
//! messages (a partition delays them), results come back when the statement finishes — which may be
//! much later for one that waits on a lock.

pub mod client;
mod exec;
#[cfg(test)]
mod tests;

use super::{Backend, Now, Out};
use crate::history::{EventKind, NodeIx};
use crate::net::Probe;
use std::collections::BTreeMap;
use std::time::Duration;

pub type ConnId = u64;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
}

pub type Row = BTreeMap<String, Value>;

/// A value a statement computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Value(Value),
    /// The server's `now()` in milliseconds, plus an offset.
    NowPlus(i64),
    /// A column of the row, plus an offset (`n - 1`).
    ColumnPlus(String, i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// `column op expr`, part of a WHERE clause (all must hold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub column: String,
    pub op: Op,
    pub rhs: Expr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    Begin,
    Commit,
    Rollback,
    /// `SELECT * FROM table WHERE key = $1 [FOR UPDATE]`
    Select {
        table: String,
        key: String,
        for_update: bool,
    },
    /// `INSERT INTO table VALUES ($key, …)`
    Insert {
        table: String,
        key: String,
        row: Vec<(String, Expr)>,
    },
    /// `UPDATE table SET … WHERE key = $1 AND …`
    Update {
        table: String,
        key: String,
        set: Vec<(String, Expr)>,
        cond: Vec<Cond>,
    },
    /// `DELETE FROM table WHERE key = $1 AND …`
    Delete {
        table: String,
        key: String,
        cond: Vec<Cond>,
    },
    NextVal {
        sequence: String,
    },
    AdvisoryLock(i64),
    TryAdvisoryLock(i64),
    AdvisoryUnlock(i64),
    /// `SET lock_timeout = …` (0: wait for ever).
    SetLockTimeout(Duration),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlResult {
    Done,
    Rows(Vec<Row>),
    /// Rows an UPDATE or DELETE changed.
    Affected(u64),
    Int(i64),
    Bool(bool),
    Error(SqlError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlError {
    /// 23505 unique_violation.
    UniqueViolation,
    /// 55P03 lock_not_available (lock_timeout).
    LockTimeout,
    /// 25P02 in_failed_sql_transaction.
    TransactionAborted,
    /// 42P01 undefined_table.
    UndefinedTable,
    /// The server ended the session (or never knew it).
    Terminated,
}

/// What a client sends on its connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlRequest {
    /// Open a session for connection `conn` from this life of the client's node.
    Connect {
        conn: ConnId,
        incarnation: u32,
    },
    Execute {
        conn: ConnId,
        seq: u64,
        stmt: Stmt,
    },
    /// The client closed its socket.
    Close {
        conn: ConnId,
    },
}

/// A statement's result, sent back on its connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlResponse {
    pub conn: ConnId,
    pub seq: u64,
    pub result: SqlResult,
}

/// The server's connection settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub tcp_keepalives_idle: Duration,
    pub tcp_keepalives_interval: Duration,
    pub tcp_keepalives_count: u32,
    /// Zero: off (the default).
    pub idle_in_transaction_session_timeout: Duration,
}

/// Something a statement can wait for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Lock {
    Row(String, String),
    Advisory(i64),
}

#[derive(Debug)]
struct Session {
    node: NodeIx,
    incarnation: u32,
    /// Undo records of the open transaction (`None`: no explicit transaction).
    txn: Option<Vec<Undo>>,
    /// The open transaction has failed: only its end is accepted.
    aborted: bool,
    lock_timeout_ms: i64,
    /// When the server last heard from the client (keep-alive idle time counts from here).
    heard_ms: i64,
    /// When the session last finished a statement (idle in transaction counts from here).
    idle_since_ms: i64,
    /// The statement waiting on a lock, if any.
    waiting: bool,
    /// The client has gone; end the session once its waiting statement finishes.
    closing: bool,
    /// Keep-alive probes sent since the peer was last heard (Linux `icsk_probes_out`).
    probes_out: u32,
    next_probe_ms: i64,
}

/// The row as it was before a change, to put back on rollback.
#[derive(Debug)]
struct Undo {
    table: String,
    key: String,
    before: Option<Row>,
}

/// A statement waiting on a lock.
#[derive(Debug)]
struct Parked {
    conn: ConnId,
    seq: u64,
    stmt: Stmt,
    on: Lock,
    /// Server time at which `lock_timeout` gives up on it (`None`: never).
    deadline_ms: Option<i64>,
}

/// One PostgreSQL server's state.
#[derive(Debug)]
pub struct SqlState {
    settings: Settings,
    tables: BTreeMap<String, BTreeMap<String, Row>>,
    sequences: BTreeMap<String, i64>,
    /// Who holds each lock, and (advisory) how many times.
    locks: BTreeMap<Lock, (ConnId, u32)>,
    /// Waiting statements, oldest first.
    parked: Vec<Parked>,
    sessions: BTreeMap<ConnId, Session>,
}

/// How often the server looks at lock timeouts and idle sessions.
const TICK: Duration = Duration::from_millis(100);

impl SqlState {
    pub fn new(settings: Settings) -> SqlState {
        SqlState {
            settings,
            tables: BTreeMap::new(),
            sequences: BTreeMap::new(),
            locks: BTreeMap::new(),
            parked: Vec::new(),
            sessions: BTreeMap::new(),
        }
    }

    /// Create a table (the schema the recipes expect), with its first rows.
    pub fn create_table(&mut self, name: &str, rows: impl IntoIterator<Item = (String, Row)>) {
        self.tables.insert(name.to_string(), rows.into_iter().collect());
    }

    pub fn create_sequence(&mut self, name: &str) {
        self.sequences.insert(name.to_string(), 0);
    }

    /// After a restart: sessions and uncommitted work are gone; committed rows and sequences survive.
    pub fn recover(&mut self) {
        let conns: Vec<ConnId> = self.sessions.keys().copied().collect();
        for conn in conns {
            self.rollback(conn);
        }
        self.sessions.clear();
        self.parked.clear();
        self.locks.clear();
    }

    /// Run the kernel's keep-alive timer of every session (Linux `tcp_keepalive_timer`), asking
    /// `probe` what a probe to the client's connection would find:
    /// - once the connection has been silent for `tcp_keepalives_idle` (since the last data or ACK
    ///   received), a probe goes out every `tcp_keepalives_interval`; an answered one counts as
    ///   hearing from the peer, so the next comes a full idle period later (`rcv_tstamp`);
    /// - when `tcp_keepalives_count` probes are out unanswered, the connection is reset: at idle +
    ///   count × interval of silence;
    /// - a restarted client host answers a probe with a reset;
    /// - while results sent to the client are unacknowledged there are no probes: the retransmission
    ///   timer decides, and ends the connection when it gives up.
    pub fn keepalive(&mut self, now: Now, mut probe: impl FnMut(NodeIx, u32) -> Probe, out: &mut Out) {
        let (idle, interval, count) = (
            self.settings.tcp_keepalives_idle.as_millis() as i64,
            self.settings.tcp_keepalives_interval.as_millis() as i64,
            self.settings.tcp_keepalives_count,
        );
        let mut dead = Vec::new();
        for (conn, s) in &mut self.sessions {
            let due = now.mono_ms - s.heard_ms >= idle && now.mono_ms >= s.next_probe_ms;
            match probe(s.node, s.incarnation) {
                Probe::Retransmitting { gave_up: true } => {
                    dead.push((*conn, "connection timed out: retransmissions unanswered"))
                }
                Probe::Retransmitting { gave_up: false } => {}
                _ if !due => {}
                Probe::Reset => dead.push((*conn, "connection reset by the restarted client host")),
                Probe::Acked => {
                    s.heard_ms = now.mono_ms;
                    s.probes_out = 0;
                }
                Probe::Unanswered if s.probes_out >= count => {
                    dead.push((*conn, "connection dead: keep-alive probes unanswered"))
                }
                Probe::Unanswered => {
                    s.probes_out += 1;
                    s.next_probe_ms = now.mono_ms + interval;
                }
            }
        }
        for (conn, why) in &dead {
            self.end_session(*conn, why, out);
        }
        if !dead.is_empty() {
            self.wake(now, out);
        }
    }

    fn respond(&self, conn: ConnId, seq: u64, result: SqlResult, out: &mut Out) {
        if let Some(s) = self.sessions.get(&conn) {
            out.push(s.node, SqlResponse { conn, seq, result });
        }
    }

    /// End a session: roll back, free its locks, drop its waiting statement, and let others run.
    fn end_session(&mut self, conn: ConnId, why: &str, out: &mut Out) {
        let Some(s) = self.sessions.get(&conn) else { return };
        out.record(s.node, EventKind::Session { state: format!("database session ended: {why}") });
        self.rollback(conn);
        self.locks.retain(|_, (owner, _)| *owner != conn);
        self.parked.retain(|p| p.conn != conn);
        self.sessions.remove(&conn);
    }

    fn request(&mut self, now: Now, from: NodeIx, request: SqlRequest, out: &mut Out) {
        match request {
            SqlRequest::Connect { conn, incarnation } => {
                let session = Session {
                    node: from,
                    incarnation,
                    txn: None,
                    aborted: false,
                    lock_timeout_ms: 0,
                    heard_ms: now.mono_ms,
                    idle_since_ms: now.mono_ms,
                    waiting: false,
                    closing: false,
                    probes_out: 0,
                    next_probe_ms: 0,
                };
                self.sessions.insert(conn, session);
            }
            SqlRequest::Execute { conn, seq, stmt } => match self.sessions.get_mut(&conn) {
                None => out.push(from, SqlResponse { conn, seq, result: SqlResult::Error(SqlError::Terminated) }),
                Some(s) => {
                    s.heard_ms = now.mono_ms;
                    s.probes_out = 0;
                    self.run(conn, seq, stmt, now, None, out);
                }
            },
            SqlRequest::Close { conn } => match self.sessions.get_mut(&conn) {
                Some(s) if s.waiting => s.closing = true,
                Some(_) => self.end_session(conn, "closed by the client", out),
                None => {}
            },
        }
        self.wake(now, out);
    }

    /// Run the waiting statements whose lock has come free, oldest first.
    fn wake(&mut self, now: Now, out: &mut Out) {
        let mut i = 0;
        while i < self.parked.len() {
            let free = self.locks.get(&self.parked[i].on).is_none_or(|(owner, _)| *owner == self.parked[i].conn);
            if !free {
                i += 1;
                continue;
            }
            let p = self.parked.remove(i);
            if let Some(s) = self.sessions.get_mut(&p.conn) {
                s.waiting = false;
            }
            self.run(p.conn, p.seq, p.stmt, now, Some((i, p.deadline_ms)), out);
            // Running it may have freed other locks (an autocommit statement): look from the start.
            i = 0;
        }
    }
}

impl Backend for SqlState {
    type Request = SqlRequest;
    /// Results travel back on the connection ([`SqlResponse`]), not as replies.
    type Reply = ();

    fn apply(&mut self, now: Now, from: NodeIx, request: SqlRequest, out: &mut Out) {
        self.request(now, from, request, out)
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(TICK)
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        let expired: Vec<usize> =
            (0..self.parked.len()).filter(|i| self.parked[*i].deadline_ms.is_some_and(|d| d <= now.mono_ms)).collect();
        for i in expired.into_iter().rev() {
            let p = self.parked.remove(i);
            self.fail(p.conn, p.seq, SqlError::LockTimeout, now, out);
        }
        let idle_ms = self.settings.idle_in_transaction_session_timeout.as_millis() as i64;
        if idle_ms > 0 {
            let idle: Vec<ConnId> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.txn.is_some() && !s.waiting && now.mono_ms - s.idle_since_ms >= idle_ms)
                .map(|(c, _)| *c)
                .collect();
            for conn in idle {
                self.end_session(conn, "terminated: idle in transaction", out);
            }
        }
        self.wake(now, out);
    }
}
