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
//! - server errors are results ([`SqlResult::Error`]) by SQLSTATE, as the sim answers them
//!   (`unique_violation`, `lock_not_available`, `in_failed_sql_transaction`, `undefined_table`,
//!   `duplicate_table`); an error that ends the session (class 08, class 57P, 25P03
//!   `idle_in_transaction_session_timeout`) closes the connection: [`ClientError::Closed`], as the
//!   sim's `Terminated`. Any other SQLSTATE is an error the model never answers (a syntax error, a
//!   column the server's table lacks, a deadlock): a harness error — it panics with the code, the
//!   server's message and the statement, and the client process's death ends the run with it.
//!
//! SQL text ([`Stmt::Text`], from `text::Schema::prepare`) is sent as written, with its values as `$1`,
//! `$2`, … (the extended query protocol, each value in text form for the server to read as its
//! column's type, as `psql` would): the user's own tables, columns and types. Its rows come back with
//! integers as integers, timestamps as epoch milliseconds (the model's times), and anything textual as
//! text. The built-in recipes' [`Stmt`]s are written as the SQL they stand for ([`write()`]), on the
//! tables of [`SCHEMA`](super::SCHEMA), and sent by the simple query protocol; a bare [`Stmt::CreateTable`] is refused
//! (a panic, saying why): it does not say its columns — prepare the `CREATE TABLE` as text. One
//! difference: tokio-postgres does not hand over `COMMIT`'s command tag, so the `COMMIT` of a failed
//! transaction reads as done, not [`SqlResult::RolledBack`] (the built-in recipes roll a failed
//! transaction back themselves before they commit anything).

use locksim_sim::backend::sql::client::{ClientError, CONNECT_TIMEOUT};
use locksim_sim::backend::sql::text::{write, Style};
use locksim_sim::backend::sql::{Row, SqlError, SqlResult, SqlText, Stmt, Value};
use std::cell::Cell;
use std::error::Error;
use std::time::Duration;
use tokio_postgres::types::{Format, FromSql, IsNull, ToSql, Type};
use tokio_postgres::SimpleQueryMessage;

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
        let (sql, answer) = match &stmt {
            Stmt::Text(text) => (text.sql.clone(), self.timed(self.text(text)).await?),
            Stmt::CreateTable { table, .. } => panic!(
                "CREATE TABLE {table} as a Stmt does not say its columns, and a real server needs them: prepare the \
                 CREATE TABLE as SQL text (text::Schema::prepare, then SqlApi::query) to send it as written"
            ),
            stmt => {
                let text = write(stmt, &Style::REAL);
                let answer = self.timed(self.client.simple_query(&text)).await?;
                (text, answer.map(|messages| result(stmt, &messages)))
            }
        };
        match answer {
            Ok(result) => Ok(result),
            Err(_) if self.client.is_closed() => {
                self.close();
                Err(ClientError::Closed)
            }
            Err(e) => match error(&e, &sql) {
                Some(error) => Ok(SqlResult::Error(error)),
                None => {
                    self.close();
                    Err(ClientError::Closed)
                }
            },
        }
    }

    /// `answer` within the read timeout; past it the connection is closed.
    async fn timed<T>(&self, answer: impl std::future::Future<Output = T>) -> Result<T, ClientError> {
        if self.read_timeout.is_zero() {
            return Ok(answer.await);
        }
        match tokio::time::timeout(self.read_timeout, answer).await {
            Ok(answer) => Ok(answer),
            Err(_) => {
                self.close();
                Err(ClientError::ReadTimeout)
            }
        }
    }

    /// SQL text as written, with its values, by the extended query protocol; the answer as the model
    /// statement it stands for answers.
    async fn text(&self, text: &SqlText) -> Result<SqlResult, tokio_postgres::Error> {
        let params: Vec<Param> = text.params.iter().map(Param).collect();
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let sql = text.sql.as_str();
        let first = |rows: Vec<Row>| rows.into_iter().next().and_then(|row| row.into_values().next());
        Ok(match &text.stmt {
            Stmt::Insert { .. }
            | Stmt::InsertOnConflictDoNothing { .. }
            | Stmt::Update { .. }
            | Stmt::Delete { .. } => SqlResult::Affected(self.client.execute(sql, &params).await?),
            Stmt::Select { .. } => SqlResult::Rows(typed_rows(sql, self.client.query(sql, &params).await?)),
            Stmt::NextVal { .. } => match first(typed_rows(sql, self.client.query(sql, &params).await?)) {
                Some(Value::Int(n)) => SqlResult::Int(n),
                other => SqlResult::Error(unexpected(other)),
            },
            Stmt::TryAdvisoryLock(_) | Stmt::AdvisoryUnlock(_) | Stmt::TryAdvisoryXactLock(_) => {
                match first(typed_rows(sql, self.client.query(sql, &params).await?)) {
                    Some(Value::Text(t)) => SqlResult::Bool(t == "t"),
                    other => SqlResult::Error(unexpected(other)),
                }
            }
            _ => {
                self.client.execute(sql, &params).await?;
                SqlResult::Done
            }
        })
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

/// A server error by its SQLSTATE, as the sim names it; `None`: the session is over (the connection
/// closes). An SQLSTATE the model does not answer is a harness error, with its code and message.
fn error(e: &tokio_postgres::Error, sql: &str) -> Option<SqlError> {
    let state = e.code()?;
    match state.code() {
        "23505" => Some(SqlError::UniqueViolation),
        "55P03" => Some(SqlError::LockTimeout),
        "25P02" => Some(SqlError::TransactionAborted),
        "42P01" => Some(SqlError::UndefinedTable),
        "42P07" => Some(SqlError::DuplicateTable),
        // The server ended the session: admin_shutdown, crash_shutdown, idle timeouts, connection errors.
        c if c.starts_with("57P") || c == "25P03" || c.starts_with("08") => None,
        code => {
            let message = e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_string());
            panic!(
                "PostgreSQL answered SQLSTATE {code} ({message}) to {sql:?}: an error the model never answers, so \
                 this run cannot be judged (statements built as Stmt values name the key column `k` and the \
                 built-in tables; write your own as SQL text with text::Schema::prepare)"
            )
        }
    }
}

/// A bind parameter's value, sent in text form: the server reads it as the type it infers for its
/// place (a `varchar` key, a `bigint`, …), as it reads a quoted literal.
#[derive(Debug)]
struct Param<'a>(&'a Value);

impl ToSql for Param<'_> {
    // postgres-types re-exports `bytes::BytesMut` here (its `to_sql_checked!` names it so too).
    fn to_sql(
        &self,
        _: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match self.0 {
            Value::Null => return Ok(IsNull::Yes),
            Value::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
            Value::Text(t) => out.extend_from_slice(t.as_bytes()),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }

    tokio_postgres::types::to_sql_checked!();
}

/// Milliseconds from the Unix epoch to PostgreSQL's (2000-01-01), from which its timestamps count.
const POSTGRES_EPOCH_MS: i64 = 946_684_800_000;

/// A column of an extended-protocol row in the model's terms.
struct Column(Value);

impl<'a> FromSql<'a> for Column {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Column, Box<dyn Error + Sync + Send>> {
        let value = match *ty {
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            // As the simple protocol shows a boolean.
            Type::BOOL => Value::Text(if bool::from_sql(ty, raw)? { "t" } else { "f" }.into()),
            // Microseconds since PostgreSQL's epoch, as epoch milliseconds.
            Type::TIMESTAMP | Type::TIMESTAMPTZ => {
                Value::Int(i64::from_sql(&Type::INT8, raw)?.div_euclid(1000) + POSTGRES_EPOCH_MS)
            }
            _ if <&str as FromSql>::accepts(ty) => Value::Text(<&str>::from_sql(ty, raw)?.to_string()),
            _ => return Err(format!("a column of type {ty}, which the model does not keep").into()),
        };
        Ok(Column(value))
    }

    fn from_sql_null(_: &Type) -> Result<Column, Box<dyn Error + Sync + Send>> {
        Ok(Column(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// The rows of an extended-protocol answer; a column the model cannot read is a harness error.
fn typed_rows(sql: &str, rows: Vec<tokio_postgres::Row>) -> Vec<Row> {
    let value = |row: &tokio_postgres::Row, i: usize| match row.try_get::<_, Column>(i) {
        Ok(Column(value)) => value,
        Err(e) => panic!("reading column {} of a row of {sql:?}: {e}", row.columns()[i].name()),
    };
    let row = |row: tokio_postgres::Row| {
        (0..row.len()).map(|i| (row.columns()[i].name().to_string(), value(&row, i))).collect::<Row>()
    };
    rows.into_iter().map(row).collect()
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
        Stmt::Insert { .. } | Stmt::InsertOnConflictDoNothing { .. } | Stmt::Update { .. } | Stmt::Delete { .. } => {
            SqlResult::Affected(affected.unwrap_or(0))
        }
        Stmt::NextVal { .. } => match first() {
            Some(Value::Int(n)) => SqlResult::Int(n),
            other => SqlResult::Error(unexpected(other)),
        },
        Stmt::TryAdvisoryLock(_) | Stmt::AdvisoryUnlock(_) | Stmt::TryAdvisoryXactLock(_) => match first() {
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
