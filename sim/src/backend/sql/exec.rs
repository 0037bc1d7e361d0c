//! Running one statement in a session: what it sees, the locks it takes or waits for, its writes, and
//! the end of its transaction.

use std::collections::BTreeMap;

use super::{
    Cond, ConnId, Expr, Lock, Now, Op, Out, Parked, Row, Running, Sequence, SqlError, SqlResult, SqlState, Stmt, Txn,
    Value, Version, SEQ_LOG_VALS,
};

/// How a statement ended: with a result, or waiting for a lock another session holds (and for which
/// version of the row).
enum Ran {
    Result(SqlResult),
    Blocked(Lock, Option<super::Lineage>),
}

/// A value; `now()` is the transaction's start.
fn eval(expr: &Expr, row: Option<&Row>, now_ms: i64) -> Value {
    match expr {
        Expr::Value(v) => v.clone(),
        Expr::NowPlus(ms) => Value::Int(now_ms + ms),
        Expr::ColumnPlus(column, delta) => match row.and_then(|r| r.get(column)) {
            Some(Value::Int(n)) => Value::Int(n + delta),
            _ => Value::Null,
        },
    }
}

/// SQL comparison: anything compared with NULL is not true.
fn holds(cond: &Cond, row: &Row, now_ms: i64) -> bool {
    let (Some(lhs), rhs) = (row.get(&cond.column), eval(&cond.rhs, Some(row), now_ms)) else { return false };
    if *lhs == Value::Null || rhs == Value::Null {
        return false;
    }
    let order = lhs.cmp(&rhs);
    match cond.op {
        Op::Eq => order.is_eq(),
        Op::Ne => order.is_ne(),
        Op::Lt => order.is_lt(),
        Op::Le => order.is_le(),
        Op::Gt => order.is_gt(),
        Op::Ge => order.is_ge(),
    }
}

fn row_lock(table: &str, key: &str) -> Lock {
    Lock::Row(table.to_string(), key.to_string())
}

impl SqlState {
    /// Run a statement and answer it, or park it on the lock it waits for (back at `requeue`'s place
    /// in line if it was waiting already).
    pub(super) fn run(&mut self, st: Running, now: Now, requeue: Option<usize>, out: &mut Out) {
        let session = self.sessions.get_mut(&st.conn).expect("a running statement has a session");
        let explicit = session.txn.is_some();
        let ran = if session.aborted && !matches!(st.stmt, Stmt::Commit | Stmt::Rollback) {
            Ran::Result(SqlResult::Error(SqlError::TransactionAborted))
        } else {
            if !explicit {
                // Autocommit: the statement is its own transaction.
                session.txn = Some(Txn { start_wall_ms: st.start_wall_ms, flushes: false, writes: Default::default() });
            }
            self.statement(&st, now)
        };
        let (conn, seq) = (st.conn, st.seq);
        match ran {
            Ran::Blocked(on, lineage) => {
                let session = self.sessions.get_mut(&conn).expect("checked");
                if !explicit {
                    session.txn = None;
                }
                session.waiting = true;
                let timeout = session.lock_timeout_ms;
                let first = !self.parked.iter().any(|q| q.on == on);
                let deadline_ms = (timeout > 0).then_some(now.mono_ms + timeout);
                let at = requeue.unwrap_or(self.parked.len());
                self.parked.insert(at, Parked { run: Running { lineage, ..st }, on, first, deadline_ms });
            }
            Ran::Result(SqlResult::Error(e)) => self.fail_in(conn, seq, e, explicit, now, out),
            Ran::Result(result) => {
                if !explicit && !matches!(st.stmt, Stmt::Begin) {
                    self.commit(conn);
                }
                self.finish(conn, seq, result, now, out);
            }
        }
    }

    /// A waiting statement gave up (`lock_timeout`).
    pub(super) fn fail(&mut self, conn: ConnId, seq: u64, error: SqlError, now: Now, out: &mut Out) {
        let Some(session) = self.sessions.get_mut(&conn) else { return };
        session.waiting = false;
        let explicit = session.txn.is_some();
        self.fail_in(conn, seq, error, explicit, now, out);
    }

    /// An error: it aborts the transaction at once — writes dropped, row locks freed — and an
    /// explicit one's block then waits for its end.
    fn fail_in(&mut self, conn: ConnId, seq: u64, error: SqlError, explicit: bool, now: Now, out: &mut Out) {
        self.rollback(conn);
        if explicit {
            let session = self.sessions.get_mut(&conn).expect("failing session");
            session.txn = Some(Txn { start_wall_ms: now.wall_ms, flushes: false, writes: Default::default() });
            session.aborted = true;
        }
        self.finish(conn, seq, SqlResult::Error(error), now, out);
    }

    /// Answer the client; a session whose client has gone ends now.
    fn finish(&mut self, conn: ConnId, seq: u64, result: SqlResult, now: Now, out: &mut Out) {
        self.respond(conn, seq, result, out);
        let session = self.sessions.get_mut(&conn).expect("finishing session");
        session.idle_since_ms = now.mono_ms;
        // A backend idle again (`ReadyForQuery`, status `I`) goes back to the pooler, which may close it.
        if session.pooled && session.txn.is_none() && !self.release(conn, now, out) {
            return;
        }
        let session = &self.sessions[&conn];
        if let Some(why) = session.closing {
            self.end_session(conn, why, out);
        }
    }

    /// End the transaction: its writes reach the tables (and the WAL is flushed, if it wrote any);
    /// its row locks are freed.
    fn commit(&mut self, conn: ConnId) {
        let Some(txn) = self.sessions.get_mut(&conn).and_then(|s| s.txn.take()) else {
            return self.end_transaction(conn);
        };
        if txn.flushes {
            self.sequences.values_mut().for_each(|s| s.flushed = s.logged);
        }
        for ((table, key), version) in txn.writes {
            let rows = self.tables.get_mut(&table).expect("writes to an existing table");
            match version {
                Some(v) => rows.insert(key, v),
                None => rows.remove(&key),
            };
        }
        self.end_transaction(conn);
    }

    /// End the transaction dropping its writes; free its row locks.
    pub(super) fn rollback(&mut self, conn: ConnId) {
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.txn = None;
        }
        self.end_transaction(conn);
    }

    /// Free the transaction's locks: its row locks and its transaction-level advisory holds.
    fn end_transaction(&mut self, conn: ConnId) {
        let mut xact_advisory = BTreeMap::new();
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.aborted = false;
            xact_advisory = std::mem::take(&mut session.xact_advisory);
        }
        for (key, n) in xact_advisory {
            self.let_go(Lock::Advisory(key), n);
        }
        self.locks.retain(|lock, (owner, _)| !(matches!(lock, Lock::Row(..)) && *owner == conn));
    }

    /// Give up `n` of the holds of `lock` (its holder's).
    fn let_go(&mut self, lock: Lock, n: u32) {
        if let Some((_, count)) = self.locks.get_mut(&lock) {
            *count -= n;
            if *count == 0 {
                self.locks.remove(&lock);
            }
        }
    }

    /// Take advisory lock `key` for `conn`'s transaction, or say who has it.
    fn take_for_transaction(&mut self, conn: ConnId, key: i64) -> Result<(), Lock> {
        self.take(conn, Lock::Advisory(key))?;
        if let Some(session) = self.sessions.get_mut(&conn) {
            *session.xact_advisory.entry(key).or_default() += 1;
        }
        Ok(())
    }

    /// Take `lock` for `conn`, or say who has it.
    fn take(&mut self, conn: ConnId, lock: Lock) -> Result<(), Lock> {
        if matches!(lock, Lock::Row(..)) {
            self.flushes_at_commit(conn);
        }
        match self.locks.get_mut(&lock) {
            Some((owner, _)) if *owner != conn => Err(lock),
            Some((_, count)) => {
                *count += 1;
                Ok(())
            }
            None => {
                self.locks.insert(lock, (conn, 1));
                Ok(())
            }
        }
    }

    /// The row `conn` sees: its own transaction's version, else the committed one; `lineage`: only if
    /// it is still that row.
    fn visible(&self, conn: ConnId, table: &str, key: &str, lineage: Option<super::Lineage>) -> Option<Version> {
        let own = self.sessions.get(&conn).and_then(|s| s.txn.as_ref()?.writes.get(&(table.into(), key.into())));
        let version = match own {
            Some(written) => written.clone(),
            None => self.tables.get(table)?.get(key).cloned(),
        };
        version.filter(|v| lineage.is_none_or(|l| v.lineage == l))
    }

    /// Whether another open transaction has inserted, updated or deleted `key`.
    fn written_by_other(&self, conn: ConnId, table: &str, key: &str) -> bool {
        let key = (table.to_string(), key.to_string());
        self.sessions.iter().any(|(c, s)| *c != conn && s.txn.as_ref().is_some_and(|t| t.writes.contains_key(&key)))
    }

    /// The transaction has a transaction id (a row lock; PostgreSQL assigns one even to a failed
    /// attempt, which is all the same here: a commit after it flushes) or wrote WAL.
    fn flushes_at_commit(&mut self, conn: ConnId) {
        if let Some(txn) = self.sessions.get_mut(&conn).and_then(|s| s.txn.as_mut()) {
            txn.flushes = true;
        }
    }

    fn write(&mut self, conn: ConnId, table: &str, key: &str, version: Option<Version>) {
        let txn = self.sessions.get_mut(&conn).and_then(|s| s.txn.as_mut()).expect("writes happen in a transaction");
        txn.writes.insert((table.to_string(), key.to_string()), version);
    }

    /// The row an UPDATE or DELETE changes, locked: the one it sees, if that meets `cond` — checked
    /// again on the newest version once a wait for it is over; otherwise how the statement ends (no
    /// such table, no rows affected, or waiting for the row).
    fn matching(&mut self, st: &Running, table: &str, key: &str, cond: &[Cond], now_ms: i64) -> Result<Version, Ran> {
        if !self.tables.contains_key(table) {
            return Err(Ran::Result(SqlResult::Error(SqlError::UndefinedTable)));
        }
        let Some(version) = self.visible(st.conn, table, key, st.lineage) else {
            return Err(Ran::Result(SqlResult::Affected(0)));
        };
        if !cond.iter().all(|c| holds(c, &version.row, now_ms)) {
            return Err(Ran::Result(SqlResult::Affected(0)));
        }
        self.take(st.conn, row_lock(table, key)).map_err(|held| Ran::Blocked(held, Some(version.lineage)))?;
        Ok(version)
    }

    fn statement(&mut self, st: &Running, now: Now) -> Ran {
        let conn = st.conn;
        let now_ms = self.sessions[&conn].txn.as_ref().map_or(now.wall_ms, |t| t.start_wall_ms);
        let result = match &st.stmt {
            Stmt::Begin => SqlResult::Done,
            Stmt::Commit if self.sessions[&conn].aborted => {
                self.rollback(conn);
                SqlResult::RolledBack
            }
            Stmt::Commit => {
                self.commit(conn);
                SqlResult::Done
            }
            Stmt::Rollback => {
                self.rollback(conn);
                SqlResult::Done
            }
            Stmt::Select { table, key, for_update } => {
                if !self.tables.contains_key(table) {
                    return Ran::Result(SqlResult::Error(SqlError::UndefinedTable));
                }
                let Some(version) = self.visible(conn, table, key, st.lineage) else {
                    return Ran::Result(SqlResult::Rows(Vec::new()));
                };
                if *for_update {
                    if let Err(held) = self.take(conn, row_lock(table, key)) {
                        return Ran::Blocked(held, Some(version.lineage));
                    }
                }
                SqlResult::Rows(vec![version.row])
            }
            Stmt::Insert { table, key, row } | Stmt::InsertOnConflictDoNothing { table, key, row } => {
                if !self.tables.contains_key(table) {
                    return Ran::Result(SqlResult::Error(SqlError::UndefinedTable));
                }
                if self.written_by_other(conn, table, key) {
                    return Ran::Blocked(row_lock(table, key), None);
                }
                if self.visible(conn, table, key, None).is_some() {
                    return Ran::Result(match st.stmt {
                        Stmt::Insert { .. } => SqlResult::Error(SqlError::UniqueViolation),
                        _ => SqlResult::Affected(0),
                    });
                }
                if let Err(held) = self.take(conn, row_lock(table, key)) {
                    return Ran::Blocked(held, None);
                }
                let row = row.iter().map(|(c, e)| (c.clone(), eval(e, None, now_ms))).collect();
                let version = Version { lineage: self.lineage(), row };
                self.write(conn, table, key, Some(version));
                SqlResult::Affected(1)
            }
            Stmt::Update { table, key, set, cond } => match self.matching(st, table, key, cond, now_ms) {
                Ok(Version { lineage, row: before }) => {
                    let mut row = before.clone();
                    for (column, expr) in set {
                        row.insert(column.clone(), eval(expr, Some(&before), now_ms));
                    }
                    self.write(conn, table, key, Some(Version { lineage, row }));
                    SqlResult::Affected(1)
                }
                Err(ran) => return ran,
            },
            Stmt::Delete { table, key, cond } => match self.matching(st, table, key, cond, now_ms) {
                Ok(_) => {
                    self.write(conn, table, key, None);
                    SqlResult::Affected(1)
                }
                Err(ran) => return ran,
            },
            Stmt::NextVal { sequence } => match self.sequences.get_mut(sequence) {
                Some(s) => {
                    s.value += 1;
                    let value = s.value;
                    if s.value > s.logged || s.log_next {
                        (s.logged, s.log_next) = (s.value + SEQ_LOG_VALS, false);
                        self.flushes_at_commit(conn);
                    }
                    SqlResult::Int(value)
                }
                None => SqlResult::Error(SqlError::UndefinedTable),
            },
            Stmt::AdvisoryLock(key) => match self.take(conn, Lock::Advisory(*key)) {
                Ok(()) => SqlResult::Done,
                Err(held) => return Ran::Blocked(held, None),
            },
            Stmt::TryAdvisoryLock(key) => SqlResult::Bool(self.take(conn, Lock::Advisory(*key)).is_ok()),
            Stmt::AdvisoryUnlock(key) => {
                // Only a session-level hold: the transaction's stay until it ends.
                let in_txn = self.sessions[&conn].xact_advisory.get(key).copied().unwrap_or(0);
                match self.locks.get(&Lock::Advisory(*key)) {
                    Some((owner, count)) if *owner == conn && *count > in_txn => {
                        self.let_go(Lock::Advisory(*key), 1);
                        SqlResult::Bool(true)
                    }
                    _ => SqlResult::Bool(false),
                }
            }
            Stmt::AdvisoryXactLock(key) => match self.take_for_transaction(conn, *key) {
                Ok(()) => SqlResult::Done,
                Err(held) => return Ran::Blocked(held, None),
            },
            Stmt::TryAdvisoryXactLock(key) => SqlResult::Bool(self.take_for_transaction(conn, *key).is_ok()),
            Stmt::CreateTable { table, if_not_exists } => match self.tables.contains_key(table) {
                true if *if_not_exists => SqlResult::Done,
                true => SqlResult::Error(SqlError::DuplicateTable),
                false => {
                    self.tables.insert(table.clone(), BTreeMap::new());
                    SqlResult::Done
                }
            },
            Stmt::CreateSequence { sequence, if_not_exists } => match self.sequences.contains_key(sequence) {
                true if *if_not_exists => SqlResult::Done,
                true => SqlResult::Error(SqlError::DuplicateTable),
                false => {
                    self.sequences.insert(sequence.clone(), Sequence::default());
                    SqlResult::Done
                }
            },
            Stmt::SetLockTimeout(timeout) => {
                self.sessions.get_mut(&conn).expect("running").lock_timeout_ms = timeout.as_millis() as i64;
                SqlResult::Done
            }
            Stmt::SetIdleInTransactionSessionTimeout(timeout) => {
                self.sessions.get_mut(&conn).expect("running").idle_timeout_ms = timeout.as_millis() as i64;
                SqlResult::Done
            }
            Stmt::Text(_) => unreachable!("SQL text arrives as the model's statement"),
        };
        Ran::Result(result)
    }
}
