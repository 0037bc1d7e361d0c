//! The database family on a real PostgreSQL: [`RealConnection`], one real connection and session, over
//! tokio-postgres, for real mode's client processes.
//!
//! It keeps the simulated connection's contract ([`Connection`](locksim_sim::backend::sql::client::Connection)),
//! as pgjdbc does:
//! - opening waits at most [`CONNECT_TIMEOUT`]; `None` when the server cannot be reached;
//! - a statement waits at most the socket timeout (0: for ever); past it the result is
//!   [`ClientError::ReadTimeout`] — the statement may have run — and the connection is closed (the
//!   server may go on running it, as it does when pgjdbc gives up);
//! - a connection the server ended (`idle_in_transaction_session_timeout`, a restart, a terminated
//!   backend) is [`ClientError::Closed`] from then on; it never opens again;
//! - server errors are results ([`SqlResult::Error`]) by SQLSTATE, as the sim answers them.
//!
//! Statements are written as the SQL the recipes' [`Stmt`]s stand for ([`write()`]) and sent by the simple
//! query protocol. One difference: tokio-postgres does not hand over `COMMIT`'s command tag, so the
//! `COMMIT` of a failed transaction reads as done, not [`SqlResult::RolledBack`] (the built-in recipes
//! roll a failed transaction back themselves before they commit anything).

use locksim_sim::backend::sql::client::{ClientError, CONNECT_TIMEOUT};
use locksim_sim::backend::sql::text::{write, Style};
use locksim_sim::backend::sql::{Row, SqlError, SqlResult, Stmt, Value};
use std::cell::Cell;
use std::time::Duration;
use tokio_postgres::SimpleQueryMessage;

/// The tables and sequence the built-in recipes use, as real mode makes them on a fresh server (the
/// simulated server's, whose rows take any column: here typed as the recipes write them): `lock_rows`
/// with its one row `lock` (`sql.for-update`), `locks` (`sql.unique-insert`: the holder's `owner`),
/// `shedlock` (`sql.unique-insert-expiry`: ShedLock's `lock_until`, `locked_at` in epoch milliseconds,
/// and `locked_by`), and the sequence `fence`.
pub const SCHEMA: &str = "CREATE TABLE lock_rows (k text PRIMARY KEY); INSERT INTO lock_rows (k) VALUES ('lock'); \
                          CREATE TABLE locks (k text PRIMARY KEY, owner text); \
                          CREATE TABLE shedlock (k text PRIMARY KEY, lock_until bigint, locked_at bigint, \
                          locked_by text); \
                          CREATE SEQUENCE fence;";

/// One connection to a real server: one session.
pub struct RealConnection {
    client: tokio_postgres::Client,
    /// The task that drives the socket; aborted (the socket closed) by a read timeout or a drop.
    driver: tokio::task::JoinHandle<()>,
    read_timeout: Duration,
    closed: Cell<bool>,
}

impl RealConnection {
    /// Connect with `conninfo` (a libpq connection string) within [`CONNECT_TIMEOUT`].
    pub async fn open(conninfo: &str, read_timeout: Duration) -> Option<RealConnection> {
        let connect = tokio_postgres::connect(conninfo, tokio_postgres::NoTls);
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, connect).await.ok()?.ok()?;
        let driver = tokio::task::spawn_local(async move {
            let _ = connection.await;
        });
        Some(RealConnection { client, driver, read_timeout, closed: Cell::new(false) })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get() || self.client.is_closed()
    }

    /// Run one statement and wait for its result.
    pub async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError> {
        if self.is_closed() {
            return Err(ClientError::Closed);
        }
        let text = write(&stmt, &Style::REAL);
        let query = self.client.simple_query(&text);
        let answer = if self.read_timeout.is_zero() {
            query.await
        } else {
            match tokio::time::timeout(self.read_timeout, query).await {
                Ok(answer) => answer,
                Err(_) => {
                    self.close();
                    return Err(ClientError::ReadTimeout);
                }
            }
        };
        match answer {
            Ok(messages) => Ok(result(&stmt, &messages)),
            Err(_) if self.client.is_closed() => {
                self.close();
                Err(ClientError::Closed)
            }
            Err(e) => match e.code() {
                Some(state) => Ok(SqlResult::Error(error(state.code()))),
                None => {
                    self.close();
                    Err(ClientError::Closed)
                }
            },
        }
    }

    fn close(&self) {
        self.closed.set(true);
        self.driver.abort();
    }
}

impl Drop for RealConnection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A server error by its SQLSTATE, as the sim names it.
fn error(state: &str) -> SqlError {
    match state {
        "23505" => SqlError::UniqueViolation,
        "55P03" => SqlError::LockTimeout,
        "25P02" => SqlError::TransactionAborted,
        "42P01" => SqlError::UndefinedTable,
        "42P07" => SqlError::DuplicateTable,
        _ => SqlError::Terminated,
    }
}

/// The rows of a simple query's answer, each column a text or an integer (or null).
fn rows(messages: &[SimpleQueryMessage]) -> Vec<Row> {
    let mut rows = Vec::new();
    for message in messages {
        if let SimpleQueryMessage::Row(row) = message {
            let mut out = Row::new();
            for (i, column) in row.columns().iter().enumerate() {
                let value = match row.get(i) {
                    None => Value::Null,
                    Some(text) => text.parse().map_or_else(|_| Value::Text(text.to_string()), Value::Int),
                };
                out.insert(column.name().to_string(), value);
            }
            rows.push(out);
        }
    }
    rows
}

/// A statement's answer in the sim's terms.
fn result(stmt: &Stmt, messages: &[SimpleQueryMessage]) -> SqlResult {
    let first = || rows(messages).into_iter().next().and_then(|row| row.into_values().next());
    let affected = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::CommandComplete(n) => Some(*n),
        _ => None,
    });
    match stmt {
        Stmt::Select { .. } => SqlResult::Rows(rows(messages)),
        Stmt::Insert { .. } | Stmt::Update { .. } | Stmt::Delete { .. } => SqlResult::Affected(affected.unwrap_or(0)),
        Stmt::NextVal { .. } => match first() {
            Some(Value::Int(n)) => SqlResult::Int(n),
            other => SqlResult::Error(unexpected(other)),
        },
        Stmt::TryAdvisoryLock(_) | Stmt::AdvisoryUnlock(_) => match first() {
            Some(Value::Text(t)) => SqlResult::Bool(t == "t"),
            other => SqlResult::Error(unexpected(other)),
        },
        _ => SqlResult::Done,
    }
}

/// An answer of the wrong shape: the session is as good as gone.
fn unexpected(_: Option<Value>) -> SqlError {
    SqlError::Terminated
}
