//! A simulated relational database with PostgreSQL 15's locking semantics.
//!
//! Modelled behaviour, from the PostgreSQL 15 documentation (§13.3 explicit locking, §20.3 connection
//! settings, §9.27.10 advisory lock functions):
//! - Tables of rows keyed by a text primary key, and sequences (`nextval` is not transactional).
//! - Sessions and transactions: `BEGIN` … `COMMIT`/`ROLLBACK`, or one statement at a time (autocommit).
//! - READ COMMITTED visibility (§13.2.1): a statement sees the rows committed when it starts, and its
//!   own transaction's changes; another open transaction's insert, update or delete is invisible until
//!   that transaction commits. Writes go to the transaction's write set and reach the table at commit.
//! - Row locks: `SELECT … FOR UPDATE`, `UPDATE` and `DELETE` of a row they see, and `INSERT`, lock the
//!   row until the transaction ends. A statement that needs a row another transaction has locked waits
//!   (first come, first served) until that transaction ends, then looks again at the row's newest
//!   version (`EvalPlanQual`): gone (deleted, or replaced by a new insert) — nothing; changed — its
//!   conditions are checked on the new version. One whose row is invisible, or fails its conditions as
//!   seen, does not wait at all.
//! - `INSERT` of a key (heap `_bt_check_unique`): if another open transaction has inserted, updated or
//!   deleted that key, wait for it to end, then check again; a committed row that is only locked
//!   (`FOR UPDATE`) is a unique violation at once.
//! - `lock_timeout` is per sleep (`ProcSleep`): a row's second waiter first sleeps on the tuple lock the
//!   first waiter holds and, once it is first in line, sleeps again on the holder's transaction, with
//!   the timeout counted afresh; an advisory lock is one sleep.
//! - `now()` is the transaction's start (`transaction_timestamp()`): `BEGIN`, or the arrival of an
//!   autocommit statement — not the moment a waiting statement runs — on the server's wall clock (a
//!   `clock-jump` moves it). Timers — `lock_timeout`, `idle_in_transaction_session_timeout` and the
//!   kernel's TCP keep-alive — measure intervals on the monotonic clock.
//! - An error inside a transaction block aborts the transaction at once (`AbortTransaction`): its
//!   writes are gone and its row locks freed, so waiters go on; the session then refuses everything but
//!   the block's end. Session advisory locks stay.
//! - Sequences are not transactional, and WAL-log 32 values ahead (`SEQ_LOG_VALS`, and again after a
//!   checkpoint). That log is durable only once the WAL is flushed: by the commit of a transaction that
//!   locked or wrote a row or logged a sequence; a rollback flushes nothing. After a crash `nextval`
//!   continues after the last value logged *and flushed* — skipping up to 32, or going back to values
//!   already handed out in a transaction that had not committed (seen on PostgreSQL 15 by `locksim
//!   conform sql`: a fencing token drawn inside the lock's transaction can be drawn again).
//! - Session advisory locks: `pg_advisory_lock` waits, `pg_try_advisory_lock` does not; both count up
//!   when the session already holds the key, and `pg_advisory_unlock` counts down.
//! - Transaction advisory locks: `pg_advisory_xact_lock` waits, `pg_try_advisory_xact_lock` does not;
//!   held until the transaction ends (commit, rollback, an error, the session's end; an autocommit
//!   statement's at once). A session's session- and transaction-level holds of one key stack: either
//!   takes a key the session holds at once, and `pg_advisory_unlock` releases only a session-level hold
//!   (false, with a warning, for a transaction's alone).
//! - Session death rolls back its transaction and frees its locks: the client closing its connection —
//!   or its process dying, whose kernel closes the connection for it (`pq_getbyte` reads EOF or a
//!   reset in `SocketBackend`: "unexpected EOF on client connection", and the backend exits) — TCP
//!   keep-alive finding the peer dead (`tcp_keepalives_idle` of silence, then `tcp_keepalives_count`
//!   probes `tcp_keepalives_interval` apart: [`SqlState::keepalive`]), or
//!   `idle_in_transaction_session_timeout`.
//! - A statement that is waiting on a lock when its connection ends keeps its place (the backend
//!   sleeps in `ProcSleep` on its latch, not on the socket; `client_connection_check_interval` is 0 by
//!   default): once granted it runs, an autocommit statement commits (`finish_xact_command` comes
//!   before the result is flushed), sending the result fails (`internal_flush` sets
//!   `ClientConnectionLost`), and the next `CHECK_FOR_INTERRUPTS` ends the session ("connection to
//!   client lost"), rolling back an explicit transaction and freeing its locks.
//!
//! - `CREATE TABLE` and `CREATE SEQUENCE` (with `IF NOT EXISTS`) make a user's own lock table or token
//!   sequence; a name taken is `duplicate_table`, a name unknown to a statement `undefined_table`.
//!   Columns are not declared or typed here ([`text::Schema`] checks them): a row holds what it was
//!   inserted with.
//! - `INSERT … ON CONFLICT (key) DO NOTHING` waits as `INSERT` does (speculative insertion waits for
//!   the transaction that wrote the key), then inserts nothing, without error, if the key is taken.
//!
//! Not modelled: deadlock detection (recipes lock one thing; conformance scripts never wait in a
//! cycle), `statement_timeout`, `SET` and `CREATE` undone by `ROLLBACK` (recipes set and create outside transactions), and
//! checkpoints on a timer (the real server logs a sequence ahead again after each).
//!
//! Statements are the typed [`Stmt`]; [`text`] parses them from PostgreSQL's SQL, with a clear error
//! for anything outside the subset.
//!
//! Clients talk to it over connections that behave as TCP streams: statements and results are stream
//! messages (a partition delays them), results come back when the statement finishes — which may be
//! much later for one that waits on a lock.

pub mod client;
mod exec;
mod pool;
#[cfg(test)]
mod tests;
pub mod text;

pub use pool::{PoolMode, Pooler};

use super::{Backend, Now, Out};
use crate::hazard::Hazard;
use crate::history::{EventKind, NodeIx};
use crate::net::Probe;
use pool::{Left, Pool, Released, Waiting};
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

/// A Rust value as an SQL value, for a `$n` bind parameter ([`text::Prepared::bind`]; tokio-postgres's
/// `ToSql`): text (`&str`, `String`), an integer (`i64`, `i32`, `u32`), `None` as `NULL`, or a [`Value`].
pub trait ToValue {
    fn to_value(&self) -> Value;
}

impl ToValue for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}

impl ToValue for &str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}

impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToValue for i64 {
    fn to_value(&self) -> Value {
        Value::Int(*self)
    }
}

impl ToValue for i32 {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}

impl ToValue for u32 {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

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
    /// `SELECT pg_advisory_xact_lock(key)`: held until the transaction ends.
    AdvisoryXactLock(i64),
    /// `SELECT pg_try_advisory_xact_lock(key)`.
    TryAdvisoryXactLock(i64),
    /// `SET lock_timeout = …` (0: wait for ever).
    SetLockTimeout(Duration),
    /// `SET idle_in_transaction_session_timeout = …` (0: never); sessions start with the server's.
    SetIdleInTransactionSessionTimeout(Duration),
    /// `CREATE TABLE [IF NOT EXISTS] table (key text PRIMARY KEY, …)`: a lock table of your own. Its
    /// rows are keyed by a text key and hold whatever columns they are inserted with.
    CreateTable {
        table: String,
        if_not_exists: bool,
    },
    /// `CREATE SEQUENCE [IF NOT EXISTS] sequence`, counting from 1.
    CreateSequence {
        sequence: String,
        if_not_exists: bool,
    },
    /// `INSERT INTO table … ON CONFLICT (key) DO NOTHING`: as [`Stmt::Insert`] — it waits for another
    /// open transaction's write of the key — but a key taken is no error: nothing is inserted
    /// (`Affected(0)`) and the transaction goes on.
    InsertOnConflictDoNothing {
        table: String,
        key: String,
        row: Vec<(String, Expr)>,
    },
    /// A statement as written in SQL text, with its bind parameters ([`text::Prepared::bind`]): the model
    /// runs [`SqlText::stmt`]; a real server is sent [`SqlText::sql`] as written, with
    /// [`SqlText::params`].
    Text(Box<SqlText>),
}

/// A statement of SQL text: as written, its `$1`, `$2`, … values, and what the model runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlText {
    /// The SQL as written (with `$n` placeholders).
    pub sql: String,
    /// The value of `$1`, `$2`, …
    pub params: Vec<Value>,
    /// The model's statement: the text with its values in place (never itself a [`Stmt::Text`]).
    pub stmt: Stmt,
}

impl Stmt {
    /// The statement the model runs: this one, or a [`Stmt::Text`]'s own.
    pub fn model(&self) -> &Stmt {
        match self {
            Stmt::Text(text) => text.stmt.model(),
            stmt => stmt,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlResult {
    Done,
    /// `COMMIT` of a transaction that had failed: the server rolled it back (tag `ROLLBACK`; pgjdbc
    /// 42.7 raises an error for it).
    RolledBack,
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
    /// 42P01 undefined_table: no such table or sequence.
    UndefinedTable,
    /// 42P07 duplicate_table: `CREATE` of a table or sequence that exists.
    DuplicateTable,
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

#[derive(Debug, Clone)]
struct Session {
    /// The client's node; for a pooler's backend, the node of the client it was last handed to.
    node: NodeIx,
    incarnation: u32,
    /// A backend of the pooler ([`pool`]): its peer is the pooler, and its results go to the client
    /// that holds it.
    pooled: bool,
    /// The open transaction (`None`: none, or only an autocommit statement's while it runs).
    txn: Option<Txn>,
    /// The open transaction has failed: only its end is accepted.
    aborted: bool,
    lock_timeout_ms: i64,
    idle_timeout_ms: i64,
    /// When the server last heard from the client (keep-alive idle time counts from here).
    heard_ms: i64,
    /// When the session last finished a statement (idle in transaction counts from here).
    idle_since_ms: i64,
    /// The statement waiting on a lock, if any.
    waiting: bool,
    /// The connection has ended (why); end the session once its waiting statement finishes.
    closing: Option<&'static str>,
    /// The advisory locks its transaction holds at transaction level, and how many times each.
    xact_advisory: BTreeMap<i64, u32>,
    /// Keep-alive probes sent since the peer was last heard (Linux `icsk_probes_out`).
    probes_out: u32,
    next_probe_ms: i64,
}

/// A transaction: when it started (its `now()`), and what it wrote — each row's new version, or
/// `None` for a row it deleted — seen by itself alone until it commits.
#[derive(Debug, Clone)]
struct Txn {
    start_wall_ms: i64,
    /// It has a transaction id or wrote WAL (locked or wrote a row, logged a sequence): its commit
    /// flushes the WAL.
    flushes: bool,
    writes: BTreeMap<(String, String), Option<Version>>,
}

/// Which chain of versions a row belongs to: an `INSERT` starts one, an `UPDATE` continues it.
type Lineage = u64;

/// A row as stored.
#[derive(Debug, Clone)]
struct Version {
    lineage: Lineage,
    row: Row,
}

/// A sequence: its last value, the value WAL-logged ahead of it, and the last such log flushed.
#[derive(Debug, Clone, Default)]
struct Sequence {
    value: i64,
    logged: i64,
    flushed: i64,
    /// A checkpoint (the one that ends crash recovery) came since the last log: log on the next call.
    log_next: bool,
}

/// How far ahead `nextval` logs (`SEQ_LOG_VALS` in PostgreSQL's `sequence.c`).
const SEQ_LOG_VALS: i64 = 32;

/// A statement being run, and what it keeps while it waits.
#[derive(Debug, Clone)]
struct Running {
    conn: ConnId,
    seq: u64,
    stmt: Stmt,
    /// The row version it waits to lock: once granted, a row of another lineage is not its row.
    lineage: Option<Lineage>,
    /// Its transaction's start, for an autocommit statement (an explicit one keeps its own).
    start_wall_ms: i64,
}

/// A statement waiting on a lock.
#[derive(Debug, Clone)]
struct Parked {
    run: Running,
    on: Lock,
    /// First in line for `on` (a row's first waiter sleeps on the holder's transaction).
    first: bool,
    /// Server time at which `lock_timeout` gives up on it (`None`: never).
    deadline_ms: Option<i64>,
}

/// One PostgreSQL server's state.
#[derive(Debug, Clone)]
pub struct SqlState {
    settings: Settings,
    /// Committed rows.
    tables: BTreeMap<String, BTreeMap<String, Version>>,
    next_lineage: Lineage,
    sequences: BTreeMap<String, Sequence>,
    /// Who holds each lock, and (advisory) how many times.
    locks: BTreeMap<Lock, (ConnId, u32)>,
    /// Waiting statements, oldest first.
    parked: Vec<Parked>,
    sessions: BTreeMap<ConnId, Session>,
    /// pgbouncer in front of the server, if clients connect through it.
    pool: Option<Pool>,
}

/// Why a session the client closed ended (no hazard: the client let go).
const CLOSED_BY_CLIENT: &str = "closed by the client";

/// How often the server looks at lock timeouts and idle sessions.
const TICK: Duration = Duration::from_millis(100);

impl SqlState {
    pub fn new(settings: Settings) -> SqlState {
        SqlState {
            settings,
            tables: BTreeMap::new(),
            next_lineage: 1,
            sequences: BTreeMap::new(),
            locks: BTreeMap::new(),
            parked: Vec::new(),
            sessions: BTreeMap::new(),
            pool: None,
        }
    }

    /// The same server with pgbouncer in front of it: every client connects through the pooler.
    pub fn with_pooler(mut self, pooler: Pooler) -> SqlState {
        self.pool = Some(Pool::new(pooler));
        self
    }

    /// Create a table (the schema the recipes expect), with its first rows.
    pub fn create_table(&mut self, name: &str, rows: impl IntoIterator<Item = (String, Row)>) {
        let rows = rows.into_iter().map(|(key, row)| (key, Version { lineage: self.lineage(), row })).collect();
        self.tables.insert(name.to_string(), rows);
    }

    pub fn create_sequence(&mut self, name: &str) {
        self.sequences.insert(name.to_string(), Sequence::default());
    }

    fn lineage(&mut self) -> Lineage {
        self.next_lineage += 1;
        self.next_lineage
    }

    /// After a crash and restart: sessions and uncommitted work are gone; committed rows survive, and
    /// each sequence continues after the value it last logged and flushed.
    pub fn recover(&mut self) {
        self.sessions.clear();
        self.parked.clear();
        self.locks.clear();
        // pgbouncer's backends died with the server; it closes the clients that held one, and the model
        // closes every client (each connects again).
        if let Some(pool) = &mut self.pool {
            *pool = Pool::new(pool.settings);
        }
        for s in self.sequences.values_mut() {
            *s = Sequence { value: s.flushed, logged: s.flushed, flushed: s.flushed, log_next: true };
        }
    }

    /// Whether a sequence's log has not been flushed yet: what a crash now leaves of it depends on
    /// when the server's background writers next flush the WAL (seconds, on no fixed schedule).
    pub fn sequence_unflushed(&self) -> bool {
        self.sequences.values().any(|s| s.logged != s.flushed)
    }

    /// Which sessions each waiting statement's session waits for: the lock's holder, and those ahead
    /// of it in line (PostgreSQL's deadlock detector counts both).
    pub fn waits_for(&self) -> BTreeMap<ConnId, Vec<ConnId>> {
        let mut waits = BTreeMap::new();
        for (i, p) in self.parked.iter().enumerate() {
            let ahead = self.parked[..i].iter().filter(|q| q.on == p.on).map(|q| q.run.conn);
            let holder = self.locks.get(&p.on).map(|(owner, _)| *owner);
            waits.insert(p.run.conn, holder.into_iter().chain(ahead).collect());
        }
        waits
    }

    /// Run the kernel's keep-alive timer of every session (Linux `tcp_keepalive_timer`,
    /// net/ipv4/tcp_timer.c), asking `probe` what a probe to the client's connection would find now
    /// and `acked` when (server monotonic ms) the client's kernel last acknowledged data the server
    /// sent it:
    /// - the connection is idle since the later of the last data received and the last ACK received
    ///   (`keepalive_time_elapsed`: `icsk_ack.lrcvtime`, `rcv_tstamp`) — a result the client's kernel
    ///   acknowledged counts as hearing from it, and clears the probes out (`tcp_ack`);
    /// - once idle for `tcp_keepalives_idle`, a probe goes out every `tcp_keepalives_interval`; an
    ///   answered one counts as hearing from the peer, so the next comes a full idle period later;
    /// - the last check sends no probe: the timer that finds `icsk_probes_out` ≥ `tcp_keepalives_count`
    ///   resets the connection (`tcp_write_err`), at idle + count × interval, even if the link has
    ///   healed since the last probe went out unanswered — nothing arrives from an idle peer to clear
    ///   the count;
    /// - a client host that restarted, or whose process died, answers a probe with a reset;
    /// - while results sent to the client are unacknowledged there are no probes (`packets_out`): the
    ///   retransmission timer decides, and ends the connection when it gives up.
    ///
    /// Returns when (monotonic ms) the timer of a session is next due, as far as is known now — the
    /// kernel's timer is per connection and fires on time, so the server's prober wakes then.
    pub fn keepalive(
        &mut self,
        now: Now,
        mut probe: impl FnMut(NodeIx, u32) -> Probe,
        mut acked: impl FnMut(NodeIx, u32) -> Option<i64>,
        out: &mut Out,
    ) -> Option<i64> {
        let (idle, interval, count) = (
            self.settings.tcp_keepalives_idle.as_millis() as i64,
            self.settings.tcp_keepalives_interval.as_millis() as i64,
            self.settings.tcp_keepalives_count,
        );
        let mut dead = Vec::new();
        // A pooler's backends talk to the pooler, on the server's host: never silent.
        for (conn, s) in self.sessions.iter_mut().filter(|(_, s)| s.closing.is_none() && !s.pooled) {
            let answer = probe(s.node, s.incarnation);
            if let Some(at) = acked(s.node, s.incarnation).filter(|at| *at > s.heard_ms) {
                s.heard_ms = at;
                s.probes_out = 0;
            }
            let due = now.mono_ms - s.heard_ms >= idle && now.mono_ms >= s.next_probe_ms;
            match answer {
                Probe::Retransmitting { gave_up: true } => {
                    dead.push((*conn, "connection timed out: retransmissions unanswered"))
                }
                Probe::Retransmitting { gave_up: false } => {}
                _ if !due => {}
                // The last check: no probe, whatever the link is like now.
                _ if s.probes_out >= count => dead.push((*conn, "connection dead: keep-alive probes unanswered")),
                Probe::Reset => dead.push((*conn, "connection reset by the client's host")),
                Probe::Acked => {
                    s.heard_ms = now.mono_ms;
                    s.probes_out = 0;
                }
                Probe::Unanswered => {
                    s.probes_out += 1;
                    s.next_probe_ms = now.mono_ms + interval;
                }
            }
        }
        for (conn, why) in &dead {
            self.connection_ended(*conn, why, out);
        }
        if !dead.is_empty() {
            self.wake(now, out);
        }
        let live = self.sessions.values().filter(|s| s.closing.is_none() && !s.pooled);
        live.map(|s| (s.heard_ms + idle).max(s.next_probe_ms)).min()
    }

    /// The connection of session `conn` ended (closed by the client or its kernel, or reset by
    /// keep-alive): the session ends now, or — if a statement of it waits on a lock — once that
    /// statement has run (see the module doc).
    fn connection_ended(&mut self, conn: ConnId, why: &'static str, out: &mut Out) {
        match self.sessions.get_mut(&conn) {
            Some(s) if s.waiting => s.closing = Some(why),
            Some(_) => self.end_session(conn, why, out),
            None => {}
        }
    }

    /// Send a statement's result on its connection: a backend's to the client that holds it.
    fn respond(&self, conn: ConnId, seq: u64, result: SqlResult, out: &mut Out) {
        match self.sessions.get(&conn) {
            Some(s) if s.pooled => {
                if let Some((client, node)) = self.pool.as_ref().and_then(|p| p.client_of(conn)) {
                    out.push(node, SqlResponse { conn: client, seq, result });
                }
            }
            Some(s) => out.push(s.node, SqlResponse { conn, seq, result }),
            None => {}
        }
    }

    /// End a session: roll back, free its locks, drop its waiting statement, and let others run.
    fn end_session(&mut self, conn: ConnId, why: &str, out: &mut Out) {
        let Some(s) = self.sessions.get(&conn) else { return };
        out.record(s.node, EventKind::Session { state: format!("database session ended: {why}") });
        if why != CLOSED_BY_CLIENT {
            // hazard: lease-expired-while-held (if it held): the session is the client's connection's,
            // or the one the client's pooled connection holds now.
            match s.pooled {
                false => out.lease_ended(s.node, conn),
                true => {
                    if let Some((client, node)) = self.pool.as_ref().and_then(|p| p.client_of(conn)) {
                        out.lease_ended(node, client);
                    }
                }
            }
        }
        let pooled = s.pooled;
        self.rollback(conn);
        self.locks.retain(|_, (owner, _)| *owner != conn);
        self.parked.retain(|p| p.run.conn != conn);
        self.sessions.remove(&conn);
        if let Some(pool) = self.pool.as_mut().filter(|_| pooled) {
            pool.server_gone(conn);
        }
    }

    /// A new session for `conn` from `node`'s life `incarnation`.
    fn session(&self, node: NodeIx, incarnation: u32, pooled: bool, now: Now) -> Session {
        Session {
            node,
            incarnation,
            pooled,
            txn: None,
            aborted: false,
            lock_timeout_ms: 0,
            idle_timeout_ms: self.settings.idle_in_transaction_session_timeout.as_millis() as i64,
            heard_ms: now.mono_ms,
            idle_since_ms: now.mono_ms,
            waiting: false,
            closing: None,
            xact_advisory: BTreeMap::new(),
            probes_out: 0,
            next_probe_ms: 0,
        }
    }

    /// A pooler's client disconnected: its backend goes back to the pool after `DISCARD ALL`
    /// (session mode, idle), or is closed (see [`pool`]).
    fn client_gone(&mut self, conn: ConnId, now: Now, out: &mut Out) {
        let Some(pool) = &mut self.pool else { return };
        let sessions = &self.sessions;
        let idle = |server: ConnId| sessions.get(&server).is_some_and(|s| s.txn.is_none() && !s.waiting);
        match pool.client_gone(conn, idle, now.wall_ms) {
            Left::Nothing => {}
            Left::Reset(server) => self.discard_all(server),
            Left::Close(server, why) => self.connection_ended(server, why, out),
        }
    }

    /// A backend its transaction-pooled client gave back (`ReadyForQuery`, status `I`): into the
    /// pool, reset or not, or closed at the end of its lifetime. Whether its session is still open.
    fn release(&mut self, server: ConnId, now: Now, out: &mut Out) -> bool {
        match self.pool.as_mut().map_or(Released::Kept, |p| p.idle_again(server, now.wall_ms)) {
            Released::Kept | Released::Pooled { reset: false } => true,
            Released::Pooled { reset: true } => {
                self.discard_all(server);
                true
            }
            Released::Closed => {
                self.close_unused(server, pool::LIFETIME_OVER, out);
                false
            }
        }
    }

    /// pgbouncer closes a backend no client is linked to: its session ends, and with it the session
    /// advisory locks a transaction-pooled client left on it (hazard `lease-expired-while-held`, if
    /// that client still holds the lock).
    fn close_unused(&mut self, server: ConnId, why: &'static str, out: &mut Out) {
        let holds = self.locks.iter().any(|(lock, (owner, _))| *owner == server && matches!(lock, Lock::Advisory(_)));
        if let Some((client, node)) = self.pool.as_ref().and_then(|p| p.last_client(server)).filter(|_| holds) {
            out.lease_ended(node, client);
        }
        self.end_session(server, why, out);
    }

    /// `DISCARD ALL` on a pooler's backend: `pg_advisory_unlock_all()`, and every setting back to its
    /// default.
    fn discard_all(&mut self, server: ConnId) {
        self.locks.retain(|lock, (owner, _)| !(*owner == server && matches!(lock, Lock::Advisory(_))));
        let fresh = self.settings.idle_in_transaction_session_timeout.as_millis() as i64;
        if let Some(s) = self.sessions.get_mut(&server) {
            (s.lock_timeout_ms, s.idle_timeout_ms) = (0, fresh);
        }
    }

    /// Hand waiting clients of the pooler a backend each and run their statements; whether any ran.
    fn hand_out(&mut self, now: Now, out: &mut Out) -> bool {
        let mut ran = false;
        while let Some(handed) = self.pool.as_mut().and_then(|p| p.hand_out(now.wall_ms)) {
            let (node, incarnation) = self.pool.as_ref().expect("handing out").client_node(handed.client);
            let server = handed.server;
            if handed.new {
                let session = self.session(node, incarnation, true, now);
                self.sessions.insert(server, session);
            }
            let holds =
                self.locks.iter().any(|(lock, (owner, _))| *owner == server && matches!(lock, Lock::Advisory(_)));
            if handed.other_client && holds {
                out.mark(Hazard::PooledSessionLock);
            }
            let s = self.sessions.get_mut(&server).expect("a backend has a session");
            (s.node, s.incarnation, s.heard_ms) = (node, incarnation, now.mono_ms);
            let Waiting { seq, stmt } = handed.waiting;
            self.run(Running { conn: server, seq, stmt, lineage: None, start_wall_ms: now.wall_ms }, now, None, out);
            ran = true;
        }
        ran
    }

    fn request(&mut self, now: Now, from: NodeIx, request: SqlRequest, out: &mut Out) {
        // SQL text runs as the model's statement it stands for.
        let request = match request {
            SqlRequest::Execute { conn, seq, stmt: Stmt::Text(text) } => {
                SqlRequest::Execute { conn, seq, stmt: text.stmt.model().clone() }
            }
            request => request,
        };
        match request {
            SqlRequest::Connect { conn, incarnation } => match &mut self.pool {
                Some(pool) => {
                    out.lease_started(from, conn); // hazard marks: the client's sessions are its connection's
                    pool.connect(conn, from, incarnation);
                }
                None => {
                    out.lease_started(from, conn); // hazard marks: a new session
                    let session = self.session(from, incarnation, false, now);
                    self.sessions.insert(conn, session);
                }
            },
            SqlRequest::Execute { conn, seq, stmt } if self.pool.as_ref().is_some_and(|p| p.has_client(conn)) => {
                let pool = self.pool.as_mut().expect("checked");
                match pool.server_of(conn, Waiting { seq, stmt: stmt.clone() }) {
                    Ok(server) => {
                        let s = self.sessions.get_mut(&server).expect("a backend has a session");
                        s.heard_ms = now.mono_ms;
                        let running = Running { conn: server, seq, stmt, lineage: None, start_wall_ms: now.wall_ms };
                        self.run(running, now, None, out);
                    }
                    Err(true) => {
                        out.push(from, SqlResponse { conn, seq, result: SqlResult::Error(SqlError::Terminated) })
                    }
                    // It waits for a backend ([`SqlState::hand_out`]).
                    Err(false) => {}
                }
            }
            SqlRequest::Execute { conn, seq, stmt } => match self.sessions.get_mut(&conn) {
                None => out.push(from, SqlResponse { conn, seq, result: SqlResult::Error(SqlError::Terminated) }),
                Some(s) => {
                    s.heard_ms = now.mono_ms;
                    s.probes_out = 0;
                    let running = Running { conn, seq, stmt, lineage: None, start_wall_ms: now.wall_ms };
                    self.run(running, now, None, out);
                }
            },
            SqlRequest::Close { conn } if self.pool.as_ref().is_some_and(|p| p.has_client(conn)) => {
                self.client_gone(conn, now, out)
            }
            SqlRequest::Close { conn } => self.connection_ended(conn, CLOSED_BY_CLIENT, out),
        }
        self.wake(now, out);
    }

    /// Run the waiting statements whose lock has come free, oldest first, and those of the pooler's
    /// clients that a backend has come free for.
    fn wake(&mut self, now: Now, out: &mut Out) {
        self.wake_parked(now, out);
        while self.hand_out(now, out) {
            self.wake_parked(now, out);
        }
    }

    /// Run the waiting statements whose lock has come free, oldest first; a row's new first waiter
    /// starts a new sleep (and `lock_timeout`) on its holder.
    fn wake_parked(&mut self, now: Now, out: &mut Out) {
        let mut i = 0;
        while i < self.parked.len() {
            let (on, conn) = (&self.parked[i].on, self.parked[i].run.conn);
            let free = self.locks.get(on).is_none_or(|(owner, _)| *owner == conn);
            if !free {
                let first = !self.parked[..i].iter().any(|q| q.on == self.parked[i].on);
                if first && !self.parked[i].first {
                    let timeout = self.sessions.get(&conn).map_or(0, |s| s.lock_timeout_ms);
                    let p = &mut self.parked[i];
                    p.first = true;
                    if matches!(p.on, Lock::Row(..)) {
                        p.deadline_ms = (timeout > 0).then_some(now.mono_ms + timeout);
                    }
                }
                i += 1;
                continue;
            }
            let p = self.parked.remove(i);
            if let Some(s) = self.sessions.get_mut(&p.run.conn) {
                s.waiting = false;
            }
            self.run(p.run, now, Some(i), out);
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

    /// The client's process died: its kernel closed the connection, and the backend reads the end of
    /// it (`SocketBackend`: "unexpected EOF on client connection", or "could not receive data from
    /// client: Connection reset by peer") and exits, rolling back — at once, unless a statement of
    /// the session waits on a lock.
    fn connection_closed(&mut self, now: Now, peer: NodeIx, life: u32, out: &mut Out) {
        if let Some(pool) = &self.pool {
            for conn in pool.clients_of(peer, life) {
                self.client_gone(conn, now, out);
            }
        }
        let conns: Vec<ConnId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.node == peer && s.incarnation == life && !s.pooled)
            .map(|(c, _)| *c)
            .collect();
        for conn in conns {
            self.connection_ended(conn, "connection closed by the client's kernel: its process died", out);
        }
        self.wake(now, out);
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        let expired: Vec<usize> =
            (0..self.parked.len()).filter(|i| self.parked[*i].deadline_ms.is_some_and(|d| d <= now.mono_ms)).collect();
        for i in expired.into_iter().rev() {
            let p = self.parked.remove(i);
            self.fail(p.run.conn, p.run.seq, SqlError::LockTimeout, now, out);
        }
        let idle: Vec<ConnId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.txn.is_some() && !s.waiting && s.idle_timeout_ms > 0)
            .filter(|(_, s)| now.mono_ms - s.idle_since_ms >= s.idle_timeout_ms)
            .map(|(c, _)| *c)
            .collect();
        for conn in idle {
            self.end_session(conn, "terminated: idle in transaction", out);
        }
        let unused = self.pool.as_mut().map_or(Vec::new(), |p| p.janitor(now.wall_ms));
        for (server, why) in unused {
            self.close_unused(server, why, out);
        }
        self.wake(now, out);
    }
}
