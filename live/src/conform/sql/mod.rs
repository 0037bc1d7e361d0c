//! PostgreSQL: the simulated database (`locksim_sim::backend::sql::SqlState`) against PostgreSQL 15.
//!
//! Scripts use the statements the recipes send — transactions, `SELECT … FOR UPDATE`, inserts of a
//! unique key, conditional `UPDATE`s and `DELETE`s (with `now()`), `nextval`, session advisory locks,
//! `lock_timeout` and `idle_in_transaction_session_timeout` — on one table of three keys, from two or
//! three sessions, with the server crashed and restarted (sessions killed, uncommitted work lost) and
//! stopped between them. A script step *is* a model statement, sent to the real server as the SQL it
//! stands for.
//!
//! Statements wait on each other here, so a script is drawn by playing the model as it goes: a
//! session sends its next statement only once its last one has been answered, and never one that
//! would close a cycle of waits (PostgreSQL would find the deadlock after `deadlock_timeout`; no
//! recipe takes two locks, and the model does not look for deadlocks). At its end every session still
//! open is closed, which lets every waiting statement finish.

pub mod pgbouncer;

use super::{Action, Answer, Family, ModelOf, Recover, Step, SLOT_MS};
use crate::servers::{Addr, Launcher, Server};
use crate::wire::pgwire;
use locksim_sim::backend::sql::text::{self, NowAs, Style};
use locksim_sim::backend::sql::{
    Cond, ConnId, Expr, Op as CmpOp, Row, Settings, SqlError, SqlRequest, SqlResponse, SqlResult, SqlState, Stmt, Value,
};
use locksim_sim::backend::{Now, Out};
use locksim_sim::history::{EventKind, NodeIx};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The one table scripts use (named so as not to meet a table of yours on a server given by
/// `--server`), its keys and its columns (besides the key `k`), and the sequence.
const TABLE: &str = "locksim_conform";
const SEQUENCE: &str = "locksim_conform_fence";
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const COLUMNS: [&str; 3] = ["n", "owner", "until"];
/// Advisory lock keys (unlikely to be an application's own).
const ADVISORY: [i64; 2] = [4_242_001, 4_242_002];

/// The PostgreSQL family, with the model it is checked against (a test swaps in a broken one).
pub struct Sql {
    pub model: fn() -> Box<ModelOf<SqlState>>,
}

impl Default for Sql {
    fn default() -> Self {
        Sql { model: || Box::new(fresh()) }
    }
}

impl Recover for SqlState {
    /// The server crashed and started again.
    fn recover(&mut self, _now_ms: i64) {
        SqlState::recover(self)
    }
}

/// The database every script starts from (the real one is made the same by [`Family::reset`]): the
/// table holding `k0` with `n = 3`, and the sequence.
pub fn fresh() -> SqlState {
    let settings = Settings {
        tcp_keepalives_idle: Duration::from_secs(7200),
        tcp_keepalives_interval: Duration::from_secs(75),
        tcp_keepalives_count: 9,
        idle_in_transaction_session_timeout: Duration::ZERO,
    };
    let mut db = SqlState::new(settings);
    db.create_table(TABLE, [(KEYS[0].to_string(), Row::from([("n".to_string(), Value::Int(3))]))]);
    db.create_sequence(SEQUENCE);
    db
}

fn schema() -> String {
    format!(
        "DROP TABLE IF EXISTS {TABLE}; DROP SEQUENCE IF EXISTS {SEQUENCE}; \
         CREATE TABLE {TABLE} (k text PRIMARY KEY, n bigint, owner text, until bigint); \
         INSERT INTO {TABLE} (k, n) VALUES ('k0', 3); CREATE SEQUENCE {SEQUENCE};"
    )
}

/// What a client does at a step: a statement on its session, or closing the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Stmt(Stmt),
    Close,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Stmt(stmt) => write!(f, "{}", sql(stmt, None)),
            Op::Close => write!(f, "close the connection"),
        }
    }
}

/// The SQL a statement stands for. `origin`: the real server's `now()` is written in milliseconds
/// since the script's start (the wall clock, in epoch milliseconds, at that start), as the model
/// counts it; `None` writes `now()` (for people). A `SELECT` lists [`COLUMNS`], in their order.
fn sql(stmt: &Stmt, origin: Option<i64>) -> String {
    let select = COLUMNS.join(", ");
    let now = origin.map_or(NowAs::Interval, NowAs::MillisSince);
    text::write(stmt, &Style { select: &select, now })
}

/// A value as compared: `until` (milliseconds since the script's start, set from `now()`) to its
/// slot, since a real `now()` is read a few milliseconds after the model's; everything else exactly.
fn shown(column: &str, v: Option<&Value>) -> String {
    match (column, v) {
        (_, None | Some(Value::Null)) => "null".into(),
        ("until", Some(Value::Int(ms))) => format!("@{}", ms.div_euclid(SLOT_MS as i64)),
        (_, Some(Value::Int(n))) => n.to_string(),
        (_, Some(Value::Text(s))) => s.clone(),
    }
}

/// The model's result as text.
fn show(result: &SqlResult) -> String {
    match result {
        SqlResult::Done => "ok".into(),
        SqlResult::RolledBack => "rolled back".into(),
        SqlResult::Rows(rows) if rows.is_empty() => "no rows".into(),
        SqlResult::Rows(rows) => rows.iter().map(|r| row(|c| shown(c, r.get(c)))).collect::<Vec<_>>().join("; "),
        SqlResult::Affected(n) => format!("{n} rows"),
        SqlResult::Int(n) => n.to_string(),
        SqlResult::Bool(b) => b.to_string(),
        SqlResult::Error(e) => error(*e).into(),
    }
}

fn row(value: impl Fn(&str) -> String) -> String {
    COLUMNS.iter().map(|c| format!("{c}={}", value(c))).collect::<Vec<_>>().join(" ")
}

fn error(e: SqlError) -> &'static str {
    match e {
        SqlError::UniqueViolation => "error unique_violation",
        SqlError::LockTimeout => "error lock_not_available",
        SqlError::TransactionAborted => "error in_failed_sql_transaction",
        SqlError::UndefinedTable => "error undefined_table",
        SqlError::DuplicateTable => "error duplicate_table",
        SqlError::Terminated => "terminated",
    }
}

/// The real server's reply in the model's terms.
fn show_real(stmt: &Stmt, reply: &pgwire::Reply) -> String {
    if let Some((code, message)) = &reply.error {
        return match code.as_str() {
            "23505" => error(SqlError::UniqueViolation).into(),
            "55P03" => error(SqlError::LockTimeout).into(),
            "25P02" => error(SqlError::TransactionAborted).into(),
            "42P01" => error(SqlError::UndefinedTable).into(),
            "42P07" => error(SqlError::DuplicateTable).into(),
            // Administrator or crash shutdown, idle-in-transaction timeout, a broken connection.
            c if c.starts_with("57P") || c == "25P03" || c.starts_with("08") => error(SqlError::Terminated).into(),
            _ => format!("error {code} {message}"),
        };
    }
    if reply.closed {
        return error(SqlError::Terminated).into();
    }
    let first = || reply.rows.first().and_then(|r| r.first()).cloned().flatten().unwrap_or_default();
    match stmt {
        Stmt::Commit if reply.tag == "ROLLBACK" => "rolled back".into(),
        Stmt::Select { .. } if reply.rows.is_empty() => "no rows".into(),
        Stmt::Select { .. } => {
            let rows = reply.rows.iter().map(|r| {
                row(|c| {
                    let i = COLUMNS.iter().position(|x| *x == c).expect("a column");
                    let v = r[i].as_ref().map(|s| match s.parse() {
                        Ok(n) => Value::Int(n),
                        Err(_) => Value::Text(s.clone()),
                    });
                    shown(c, v.as_ref())
                })
            });
            rows.collect::<Vec<_>>().join("; ")
        }
        Stmt::Insert { .. } | Stmt::Update { .. } | Stmt::Delete { .. } => {
            format!("{} rows", reply.tag.rsplit(' ').next().unwrap_or_default())
        }
        Stmt::NextVal { .. } => first(),
        Stmt::TryAdvisoryLock(_) | Stmt::AdvisoryUnlock(_) | Stmt::TryAdvisoryXactLock(_) => {
            (first() == "t").to_string()
        }
        _ => "ok".into(),
    }
}

/// A model database driven at a script's times: its ticks every slot (late while the server is
/// stopped), each client's session (opened before its first statement, and again after it ended),
/// and the answers, which come when a statement finishes — later than it was sent, if it waited.
struct Driver<M: ?Sized> {
    db: Box<M>,
    /// Each client's session; `None`: connect before the next statement.
    sessions: Vec<Option<ConnId>>,
    /// When the server ended a client's session (and closed its connection), if it did.
    ended: Vec<Option<u64>>,
    next_conn: ConnId,
    next_tick: u64,
    stop: (u64, u64),
    /// Each client step's answer, in step order, once given.
    answers: Vec<Option<Answer>>,
    /// Each client step's client and (for a statement) the statement.
    asked: Vec<(usize, Option<Stmt>)>,
}

impl<M: Recover<Request = SqlRequest, Reply = ()> + ?Sized> Driver<M> {
    fn new(db: Box<M>) -> Self {
        Driver {
            db,
            sessions: Vec::new(),
            ended: Vec::new(),
            next_conn: 1,
            next_tick: SLOT_MS,
            stop: (0, 0),
            answers: Vec::new(),
            asked: Vec::new(),
        }
    }

    /// Run the server's ticks up to `at`.
    fn advance(&mut self, at: u64) {
        let (db, mut ticked) = (&mut self.db, Vec::new());
        self.next_tick = super::ticks(SLOT_MS, self.next_tick, self.stop, at, |t| {
            let mut out = Out::default();
            db.tick(Now::at(t as i64), &mut out);
            ticked.push((t, out));
        });
        for (t, out) in ticked {
            self.deliver(out, t);
        }
    }

    fn deliver(&mut self, out: Out, at: u64) {
        for (_, message) in out.pushes {
            let response = message.downcast::<SqlResponse>().expect("the database pushes results");
            let SqlResponse { seq, result, .. } = *response;
            let (client, _) = self.asked[seq as usize];
            if result == SqlResult::Error(SqlError::Terminated) {
                self.sessions[client] = None;
            }
            self.answers[seq as usize] = Some(Answer { text: show(&result), at_ms: at });
        }
        for (node, event) in out.events {
            if let EventKind::Session { .. } = event {
                self.ended[node.0 as usize] = Some(at);
            }
        }
    }

    /// Play one step (after the ticks due before it).
    fn step(&mut self, s: &Step<Op>) {
        // A request sent to a stopped server is read when it continues.
        let at = if (self.stop.0..self.stop.1).contains(&s.at_ms) { self.stop.1 } else { s.at_ms };
        self.advance(at);
        match &s.action {
            Action::Restart { .. } => {
                self.db.recover(at as i64);
                for answer in self.answers.iter_mut().filter(|a| a.is_none()) {
                    *answer = Some(Answer { text: error(SqlError::Terminated).into(), at_ms: at });
                }
                self.sessions.iter_mut().for_each(|s| *s = None);
                self.ended.iter_mut().for_each(|e| *e = None);
            }
            Action::Stop { ms } => self.stop = (s.at_ms, s.at_ms + ms),
            Action::Client { client, op } => {
                let (client, seq) = (*client, self.answers.len() as u64);
                if self.sessions.len() <= client {
                    self.sessions.resize(client + 1, None);
                    self.ended.resize(client + 1, None);
                }
                self.asked.push((client, if let Op::Stmt(stmt) = op { Some(stmt.clone()) } else { None }));
                self.answers.push(None);
                // The server ended this session and closed the connection: the client's socket says
                // so at once, without asking the server (which may be stopped).
                if let Some(ended_ms) = self.ended[client].take() {
                    self.sessions[client] = None;
                    let answer = match op {
                        Op::Close => Answer { text: "closed".into(), at_ms: s.at_ms },
                        Op::Stmt(_) => {
                            Answer { text: error(SqlError::Terminated).into(), at_ms: s.at_ms.max(ended_ms) }
                        }
                    };
                    self.answers[seq as usize] = Some(answer);
                    return;
                }
                let (from, now) = (NodeIx(client as u32), Now::at(at as i64));
                let mut out = Out::default();
                let conn = match self.sessions[client] {
                    Some(conn) => conn,
                    None => {
                        let conn = self.next_conn;
                        self.next_conn += 1;
                        self.db.apply(now, from, SqlRequest::Connect { conn, incarnation: 0 }, &mut out);
                        self.sessions[client] = Some(conn);
                        conn
                    }
                };
                match op {
                    Op::Stmt(stmt) => {
                        self.db.apply(now, from, SqlRequest::Execute { conn, seq, stmt: stmt.clone() }, &mut out);
                        self.deliver(out, at);
                    }
                    Op::Close => {
                        // Closing is the client's own act, done at once; the server hears of it when
                        // it reads.
                        self.db.apply(now, from, SqlRequest::Close { conn }, &mut out);
                        self.sessions[client] = None;
                        self.answers[seq as usize] = Some(Answer { text: "closed".into(), at_ms: s.at_ms });
                        self.deliver(out, at);
                        self.ended[client] = None;
                    }
                }
            }
        }
    }

    /// Whether client `client`'s last statement is still unanswered.
    fn waiting(&self, client: usize) -> bool {
        self.asked.iter().zip(&self.answers).any(|((c, _), a)| *c == client && a.is_none())
    }

    /// When client `client` was last answered.
    fn answered_at(&self, client: usize) -> u64 {
        let mine = self.asked.iter().zip(&self.answers).filter(|((c, _), _)| *c == client);
        mine.filter_map(|(_, a)| a.as_ref().map(|a| a.at_ms)).max().unwrap_or(0)
    }
}

/// Whether the model's sessions wait on each other in a cycle.
fn deadlocked(db: &SqlState) -> bool {
    let waits = db.waits_for();
    let reaches = |from: ConnId| {
        let (mut seen, mut todo) = (Vec::new(), vec![from]);
        while let Some(c) = todo.pop() {
            for next in waits.get(&c).into_iter().flatten() {
                if *next == from {
                    return true;
                }
                if !seen.contains(next) {
                    seen.push(*next);
                    todo.push(*next);
                }
            }
        }
        false
    };
    waits.keys().any(|c| reaches(*c))
}

/// What the script generator remembers of a session, to draw statements that fit it.
#[derive(Debug, Clone, Copy, Default)]
struct Session {
    in_transaction: bool,
}

/// A client's name, as it writes it into `owner`.
fn me(client: usize) -> Expr {
    Expr::Value(Value::Text(format!("c{client}")))
}

/// `now()` plus a time that ends half a slot between two requests: 250 ms to 1.55 s.
fn ttl(rng: &mut ChaCha8Rng) -> Expr {
    Expr::NowPlus((rng.gen_range(2..=15) * SLOT_MS + SLOT_MS / 2) as i64)
}

/// A timeout that ends half a slot between two requests, or none.
fn timeout(rng: &mut ChaCha8Rng, slots_at_least: u64) -> Duration {
    match rng.gen_bool(0.2) {
        true => Duration::ZERO,
        false => Duration::from_millis(rng.gen_range(slots_at_least..=10) * SLOT_MS + SLOT_MS / 2),
    }
}

/// The conditions of an UPDATE or DELETE, besides its key: the recipes' (stock left, the owner, an
/// expired lease) or none.
fn cond(rng: &mut ChaCha8Rng, client: usize) -> Vec<Cond> {
    let c = |column: &str, op, rhs| Cond { column: column.into(), op, rhs };
    match rng.gen_range(0..5) {
        0 => vec![c("n", CmpOp::Gt, Expr::Value(Value::Int(0)))],
        1 => vec![c("owner", CmpOp::Eq, me(client))],
        2 => vec![c("until", CmpOp::Le, Expr::NowPlus(0))],
        _ => vec![],
    }
}

fn statement(rng: &mut ChaCha8Rng, client: usize, session: Session) -> Op {
    let key = KEYS[rng.gen_range(0..KEYS.len())].to_string();
    let stmt = if session.in_transaction {
        match rng.gen_range(0..23) {
            0..=5 => Stmt::Select { table: TABLE.into(), key, for_update: true },
            6..=9 => Stmt::Commit,
            10 | 11 => Stmt::Rollback,
            12 => Stmt::Select { table: TABLE.into(), key, for_update: false },
            13 => Stmt::NextVal { sequence: SEQUENCE.into() },
            14 | 15 => Stmt::AdvisoryXactLock(ADVISORY[rng.gen_range(0..2)]),
            16 => Stmt::TryAdvisoryXactLock(ADVISORY[rng.gen_range(0..2)]),
            _ => return change(rng, key, client),
        }
    } else {
        match rng.gen_range(0..24) {
            0..=5 => Stmt::Begin,
            6 => Stmt::Select { table: TABLE.into(), key, for_update: rng.gen_bool(0.5) },
            7 => Stmt::NextVal { sequence: SEQUENCE.into() },
            8 | 9 => Stmt::AdvisoryLock(ADVISORY[rng.gen_range(0..2)]),
            10 => Stmt::TryAdvisoryLock(ADVISORY[rng.gen_range(0..2)]),
            11 | 12 => Stmt::AdvisoryUnlock(ADVISORY[rng.gen_range(0..2)]),
            13 => Stmt::SetLockTimeout(timeout(rng, 1)),
            14 => Stmt::SetIdleInTransactionSessionTimeout(timeout(rng, 3)),
            15 => return Op::Close,
            16 => Stmt::Rollback,
            _ => return change(rng, key, client),
        }
    };
    Op::Stmt(stmt)
}

/// An insert, update or delete of `key`.
fn change(rng: &mut ChaCha8Rng, key: String, client: usize) -> Op {
    let table = TABLE.to_string();
    let stmt = match rng.gen_range(0..9) {
        0..=2 => {
            let mut row = vec![("n".to_string(), Expr::Value(Value::Int(rng.gen_range(0..4))))];
            row.push(("owner".into(), me(client)));
            if rng.gen_bool(0.6) {
                row.push(("until".into(), ttl(rng)));
            }
            Stmt::Insert { table, key, row }
        }
        3..=6 => {
            let set = match rng.gen_range(0..4) {
                0 => vec![("n".to_string(), Expr::ColumnPlus("n".into(), -1))],
                1 => vec![("n".to_string(), Expr::ColumnPlus("n".into(), 1))],
                2 => vec![("owner".to_string(), me(client)), ("until".into(), ttl(rng))],
                _ => vec![("until".to_string(), Expr::NowPlus(0))],
            };
            Stmt::Update { table, key, set, cond: cond(rng, client) }
        }
        _ => Stmt::Delete { table, key, cond: cond(rng, client) },
    };
    Op::Stmt(stmt)
}

/// How long a restart of the real server may take (an immediate shutdown, then crash recovery).
const RESTART_SLOTS: u64 = 15;

impl Family for Sql {
    const NAME: &'static str = "sql";
    const ABOUT: &'static str = "PostgreSQL 15 (Debian's `postgresql-15`), on its wire protocol.";
    type Op = Op;
    type Conn = Client;
    type Shared = Origin;

    fn server() -> &'static Launcher {
        &crate::servers::POSTGRES
    }

    fn script(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        draw(rng, true)
    }

    fn script_without_faults(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        draw(rng, false)
    }

    fn kind(op: &Op) -> &'static str {
        let Op::Stmt(stmt) = op else { return "close" };
        match stmt {
            Stmt::Begin => "BEGIN",
            Stmt::Commit => "COMMIT",
            Stmt::Rollback => "ROLLBACK",
            Stmt::Select { for_update: true, .. } => "SELECT FOR UPDATE",
            Stmt::Select { .. } => "SELECT",
            Stmt::Insert { .. } => "INSERT",
            Stmt::Update { cond, .. } if cond.is_empty() => "UPDATE",
            Stmt::Update { .. } => "UPDATE WHERE",
            Stmt::Delete { .. } => "DELETE",
            Stmt::NextVal { .. } => "nextval",
            Stmt::AdvisoryLock(_) => "pg_advisory_lock",
            Stmt::TryAdvisoryLock(_) => "pg_try_advisory_lock",
            Stmt::AdvisoryXactLock(_) => "pg_advisory_xact_lock",
            Stmt::TryAdvisoryXactLock(_) => "pg_try_advisory_xact_lock",
            Stmt::AdvisoryUnlock(_) => "pg_advisory_unlock",
            Stmt::SetLockTimeout(_) => "SET lock_timeout",
            Stmt::SetIdleInTransactionSessionTimeout(_) => "SET idle_in_transaction_session_timeout",
            Stmt::CreateTable { .. } => "CREATE TABLE",
            Stmt::CreateSequence { .. } => "CREATE SEQUENCE",
            Stmt::InsertOnConflictDoNothing { .. } => "INSERT ON CONFLICT DO NOTHING",
            Stmt::Text(_) => "SQL text",
        }
    }

    fn model(&self, steps: &[Step<Op>]) -> Vec<Answer> {
        let mut driver = Driver::new((self.model)());
        steps.iter().for_each(|s| driver.step(s));
        // Statements still waiting at the end wait for ever (a script never leaves one).
        driver.advance(steps.last().map_or(0, |s| s.at_ms) + 100 * SLOT_MS);
        let last = steps.last().map_or(0, |s| s.at_ms);
        driver.answers.into_iter().map(|a| a.unwrap_or(Answer { text: "no answer".into(), at_ms: last })).collect()
    }

    fn reset(server: &Server) -> anyhow::Result<Origin> {
        let mut conn = pgwire::Conn::connect(server.addr().0, Duration::from_secs(5))?;
        // Sessions of the last script (their advisory locks) are ended first; only locksim's own.
        let ours = format!(
            "FROM pg_stat_activity WHERE application_name = '{}' AND pid <> pg_backend_pid()",
            pgwire::APPLICATION
        );
        let others = format!("SELECT count(pg_terminate_backend(pid)) {ours}");
        let left = format!("SELECT count(*) {ours}");
        conn.query(&others)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while conn.query(&left)?.rows.first().and_then(|r| r[0].clone()).as_deref() != Some("0") {
            anyhow::ensure!(std::time::Instant::now() < deadline, "sessions of the last script did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
        let made = conn.query(&schema())?;
        if let Some((code, message)) = made.error {
            anyhow::bail!("making the script's table failed: {code} {message}");
        }
        conn.terminate();
        Ok(Origin(AtomicI64::new(0)))
    }

    fn started(origin: &Origin, epoch_ms: i64) {
        origin.0.store(epoch_ms, Ordering::SeqCst);
    }

    fn connect(addr: &Addr, origin: &Arc<Origin>, _: usize) -> anyhow::Result<Client> {
        Ok(Client { addr: *addr, origin: origin.clone(), conn: None })
    }

    fn send(client: &mut Client, op: &Op) -> anyhow::Result<String> {
        let Op::Stmt(stmt) = op else {
            if let Some(conn) = client.conn.take() {
                conn.terminate();
            }
            return Ok("closed".into());
        };
        let origin = client.origin.0.load(Ordering::SeqCst);
        let text = match client.conn()?.query(&sql(stmt, Some(origin))) {
            Ok(reply) => show_real(stmt, &reply),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                anyhow::bail!("no answer within {:?}", crate::wire::ANSWER_TIMEOUT)
            }
            Err(_) => error(SqlError::Terminated).into(),
        };
        if text == error(SqlError::Terminated) {
            client.conn = None;
        }
        Ok(text)
    }

    fn reconnect(client: &mut Client) {
        client.conn = None;
    }

    fn valid(steps: &[Step<Op>]) -> bool {
        rules_kept(steps)
    }
}

/// A script drawn by playing the model as it goes (see the module's doc); `faults`: with server
/// restarts and stops.
fn draw(rng: &mut ChaCha8Rng, faults: bool) -> Vec<Step<Op>> {
    let clients = rng.gen_range(2..=3);
    let mut driver = Driver::new(Box::new(fresh()));
    driver.sessions.resize(clients, None);
    driver.ended.resize(clients, None);
    let mut sessions = vec![Session::default(); clients];
    let mut steps = Vec::new();
    let mut t = 0;
    let play = |driver: &mut Driver<SqlState>, steps: &mut Vec<Step<Op>>, step: Step<Op>| {
        driver.step(&step);
        steps.push(step);
    };
    for _ in 0..rng.gen_range(15..=40) {
        t += SLOT_MS * rng.gen_range(1..=3);
        driver.advance(t);
        // A session the server ended is a new one next time.
        for (c, s) in sessions.iter_mut().enumerate() {
            if driver.sessions[c].is_none() {
                *s = Session::default();
            }
        }
        let ready: Vec<usize> =
            (0..clients).filter(|c| !driver.waiting(*c) && driver.answered_at(*c) + SLOT_MS <= t).collect();
        let someone_answered_now = (0..clients).any(|c| driver.answered_at(c) == t);
        match rng.gen_range(0..30) {
            0 if faults && !someone_answered_now && !driver.db.sequence_unflushed() => {
                play(&mut driver, &mut steps, Step { at_ms: t, action: Action::Restart { keep: true } });
                sessions.iter_mut().for_each(|s| *s = Session::default());
                t += RESTART_SLOTS * SLOT_MS;
            }
            1 if faults && !someone_answered_now && (0..clients).all(|c| !driver.waiting(c)) => {
                // One client's statement waits out the stop; nobody else sends meanwhile
                // (statements queued in a stopped server are read in no fixed order).
                let ms = SLOT_MS * rng.gen_range(2..=8);
                play(&mut driver, &mut steps, Step { at_ms: t, action: Action::Stop { ms } });
                if let Some(&client) = ready.get(rng.gen_range(0..ready.len().max(1))) {
                    let op = statement(rng, client, sessions[client]);
                    let mut tried = driver.clone();
                    tried.step(&Step { at_ms: t + SLOT_MS, action: Action::Client { client, op: op.clone() } });
                    if !deadlocked(&tried.db) {
                        sessions[client] = next_session(sessions[client], &op);
                        let step = Step { at_ms: t + SLOT_MS, action: Action::Client { client, op } };
                        play(&mut driver, &mut steps, step);
                    }
                }
                t += ms;
            }
            _ => {
                let Some(&client) = ready.get(rng.gen_range(0..ready.len().max(1))) else { continue };
                let op = statement(rng, client, sessions[client]);
                let step = Step { at_ms: t, action: Action::Client { client, op: op.clone() } };
                let mut tried = driver.clone();
                tried.step(&step);
                if deadlocked(&tried.db) {
                    continue;
                }
                sessions[client] = next_session(sessions[client], &op);
                play(&mut driver, &mut steps, step);
            }
        }
    }
    close_all(&mut driver, &mut steps, t);
    steps
}

/// Close every client's session from after `t`, one a slot, so that every waiting statement finishes
/// (a statement waiting on a lock, or for a pooler's backend, gets it as the others go).
fn close_all(driver: &mut Driver<SqlState>, steps: &mut Vec<Step<Op>>, mut t: u64) {
    let clients = driver.sessions.len();
    for _ in 0..2 * clients {
        t += SLOT_MS;
        driver.advance(t);
        let Some(client) = (0..clients).find(|c| !driver.waiting(*c) && driver.sessions[*c].is_some()) else {
            break;
        };
        t = t.max(driver.answered_at(client) + SLOT_MS);
        let step = Step { at_ms: t, action: Action::Client { client, op: Op::Close } };
        driver.step(&step);
        steps.push(step);
    }
}

/// A session's state after the generator sent `op` on it.
fn next_session(s: Session, op: &Op) -> Session {
    match op {
        Op::Stmt(Stmt::Begin) => Session { in_transaction: true },
        Op::Stmt(Stmt::Commit | Stmt::Rollback) | Op::Close => Session { in_transaction: false },
        _ => s,
    }
}

/// The rules scripts are drawn by, checked on the model: a client sends only once answered (a slot
/// after), never into a cycle of waits; a restart or stop never falls on a time something is answered;
/// a restart never comes while a sequence's log waits for a flush (whether the real server's background
/// writers flushed it is up to their timers); a stop starts with nobody waiting and hears one client
/// at most; nothing is left waiting at the end.
fn rules_kept(steps: &[Step<Op>]) -> bool {
    let mut driver = Driver::new(Box::new(fresh()));
    let mut stop = (0, 0);
    let mut sent_in_stop = 0;
    for s in steps {
        driver.advance(s.at_ms);
        let clients = driver.sessions.len();
        let answered_now = (0..clients).any(|c| driver.answered_at(c) == s.at_ms);
        match &s.action {
            Action::Client { client, .. } => {
                if driver.sessions.len() > *client
                    && (driver.waiting(*client) || driver.answered_at(*client) + SLOT_MS > s.at_ms)
                {
                    return false;
                }
                if (stop.0..stop.1).contains(&s.at_ms) {
                    sent_in_stop += 1;
                }
            }
            Action::Restart { .. } if answered_now || driver.db.sequence_unflushed() => return false,
            Action::Restart { .. } => {}
            Action::Stop { ms } => {
                if answered_now || (0..clients).any(|c| driver.waiting(c)) {
                    return false;
                }
                (stop, sent_in_stop) = ((s.at_ms, s.at_ms + ms), 0);
            }
        }
        if sent_in_stop > 1 {
            return false;
        }
        driver.step(s);
        if deadlocked(&driver.db) {
            return false;
        }
    }
    (0..driver.sessions.len()).all(|c| !driver.waiting(c))
}

impl<M: Clone> Clone for Driver<M> {
    fn clone(&self) -> Self {
        Driver {
            db: self.db.clone(),
            sessions: self.sessions.clone(),
            ended: self.ended.clone(),
            next_conn: self.next_conn,
            next_tick: self.next_tick,
            stop: self.stop,
            answers: self.answers.clone(),
            asked: self.asked.clone(),
        }
    }
}

/// Where the script's clock starts, in the real server's epoch milliseconds.
pub struct Origin(AtomicI64);

/// A client's session, opened when first used (and again after it ended).
pub struct Client {
    addr: Addr,
    origin: Arc<Origin>,
    conn: Option<pgwire::Conn>,
}

impl Client {
    fn conn(&mut self) -> anyhow::Result<&mut pgwire::Conn> {
        if self.conn.is_none() {
            self.conn = Some(pgwire::Conn::connect(self.addr.0, Duration::from_secs(5))?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::{coverage, script};
    use locksim_sim::rng::{stream, Stream};
    use std::collections::BTreeMap;

    #[test]
    fn scripts_keep_their_rules() {
        for seed in 0..300 {
            let steps = script::<Sql>(seed);
            assert_eq!(steps, script::<Sql>(seed), "a seed's script is always the same");
            assert!(rules_kept(&steps), "seed {seed}: {steps:#?}");
            let times: Vec<u64> = steps.iter().map(|s| s.at_ms).collect();
            assert!(times.iter().all(|t| t % SLOT_MS == 0), "seed {seed}: steps on the grid");
            assert!(times.windows(2).all(|w| w[0] < w[1]), "seed {seed}: one step at a time, in order");
            // For a server locksim did not start, drawn anew without faults, by the same rules.
            let calm = Sql::script_without_faults(&mut stream(seed, Stream::Conformance, 0));
            assert!(calm.iter().all(|s| matches!(s.action, Action::Client { .. })), "seed {seed}: {calm:#?}");
            assert!(rules_kept(&calm), "seed {seed}: {calm:#?}");
        }
    }

    #[test]
    fn every_statement_written_as_sql_parses_back_to_itself() {
        let mut tables = locksim_sim::backend::sql::text::Schema::new();
        let create = schema().split("; ").find(|s| s.starts_with("CREATE TABLE")).expect("the table").to_string();
        tables.parse(&create).unwrap_or_else(|e| panic!("{e}"));
        let mut parsed = 0;
        for seed in 0..300 {
            for step in script::<Sql>(seed) {
                if let Action::Client { op: Op::Stmt(stmt), .. } = step.action {
                    let text = sql(&stmt, None);
                    assert_eq!(tables.parse(&text), Ok(stmt), "seed {seed}: {text}");
                    parsed += 1;
                }
            }
        }
        assert!(parsed > 5000, "{parsed}");
    }

    #[test]
    fn three_hundred_seeds_play_every_statement_and_every_outcome() {
        let (mut counts, mut outcomes) = (BTreeMap::new(), BTreeMap::<String, u64>::new());
        for seed in 0..300 {
            let steps = script::<Sql>(seed);
            coverage::<Sql>(&steps, &mut counts);
            let sent = steps.iter().filter(|s| matches!(s.action, Action::Client { .. })).map(|s| s.at_ms);
            for (answer, at) in Sql::default().model(&steps).iter().zip(sent) {
                let kind = answer.text.split(' ').take(2).collect::<Vec<_>>().join(" ");
                if answer.at_ms > at {
                    *outcomes.entry("waited".into()).or_default() += 1;
                }
                *outcomes.entry(kind).or_default() += 1;
            }
        }
        for kind in [
            "BEGIN",
            "COMMIT",
            "ROLLBACK",
            "SELECT",
            "SELECT FOR UPDATE",
            "INSERT",
            "UPDATE",
            "UPDATE WHERE",
            "DELETE",
            "nextval",
            "pg_advisory_lock",
            "pg_try_advisory_lock",
            "pg_advisory_unlock",
            "SET lock_timeout",
            "SET idle_in_transaction_session_timeout",
            "close",
            "restart (data kept)",
            "stop",
        ] {
            assert!(counts.get(kind).copied().unwrap_or(0) >= 10, "{kind}: {counts:?}");
        }
        for outcome in [
            "waited",
            "error lock_not_available",
            "error unique_violation",
            "error in_failed_sql_transaction",
            "terminated",
            "rolled back",
            "no rows",
            "0 rows",
            "1 rows",
            "true",
            "false",
        ] {
            assert!(outcomes.get(outcome).copied().unwrap_or(0) >= 5, "{outcome}: {outcomes:?}");
        }
    }
}
