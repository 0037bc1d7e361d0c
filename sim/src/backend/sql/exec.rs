//! Running one statement in a session: locks, changes with their undo records, transaction ends.

use super::{Cond, ConnId, Expr, Lock, Now, Op, Out, Parked, Row, SqlError, SqlResult, SqlState, Stmt, Undo, Value};

/// How a statement ended: with a result, or waiting for a lock another session holds.
enum Ran {
    Result(SqlResult),
    Blocked(Lock),
}

fn eval(expr: &Expr, row: Option<&Row>, now: Now) -> Value {
    match expr {
        Expr::Value(v) => v.clone(),
        Expr::NowPlus(ms) => Value::Int(now.wall_ms + ms),
        Expr::ColumnPlus(column, delta) => match row.and_then(|r| r.get(column)) {
            Some(Value::Int(n)) => Value::Int(n + delta),
            _ => Value::Null,
        },
    }
}

/// SQL comparison: anything compared with NULL is not true.
fn holds(cond: &Cond, row: &Row, now: Now) -> bool {
    let (Some(lhs), rhs) = (row.get(&cond.column), eval(&cond.rhs, Some(row), now)) else { return false };
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

impl SqlState {
    /// Run `stmt` for `conn` and answer it, or park it on the lock it waits for (at `requeue`'s place
    /// and deadline if it was waiting already).
    pub(super) fn run(
        &mut self,
        conn: ConnId,
        seq: u64,
        stmt: Stmt,
        now: Now,
        requeue: Option<(usize, Option<i64>)>,
        out: &mut Out,
    ) {
        let session = self.sessions.get(&conn).expect("a running statement has a session");
        let explicit = session.txn.is_some();
        let ran = if session.aborted && !matches!(stmt, Stmt::Commit | Stmt::Rollback) {
            Ran::Result(SqlResult::Error(SqlError::TransactionAborted))
        } else {
            if !explicit {
                // Autocommit: the statement is its own transaction.
                self.sessions.get_mut(&conn).expect("checked").txn = Some(Vec::new());
            }
            self.statement(conn, &stmt, now)
        };
        match ran {
            Ran::Blocked(on) => {
                let session = self.sessions.get_mut(&conn).expect("checked");
                if !explicit {
                    session.txn = None;
                }
                session.waiting = true;
                let (at, deadline_ms) = match requeue {
                    Some((at, deadline)) => (at, deadline),
                    None => {
                        let timeout = session.lock_timeout_ms;
                        (self.parked.len(), (timeout > 0).then_some(now.mono_ms + timeout))
                    }
                };
                self.parked.insert(at, Parked { conn, seq, stmt, on, deadline_ms });
            }
            Ran::Result(SqlResult::Error(e)) => self.fail_in(conn, seq, e, explicit, now, out),
            Ran::Result(result) => {
                if !explicit && !matches!(stmt, Stmt::Begin) {
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

    /// An error: it aborts an explicit transaction, and undoes an autocommit statement.
    fn fail_in(&mut self, conn: ConnId, seq: u64, error: SqlError, explicit: bool, now: Now, out: &mut Out) {
        if explicit {
            self.sessions.get_mut(&conn).expect("failing session").aborted = true;
        } else {
            self.rollback(conn);
        }
        self.finish(conn, seq, SqlResult::Error(error), now, out);
    }

    /// Answer the client; a session whose client has gone ends now.
    fn finish(&mut self, conn: ConnId, seq: u64, result: SqlResult, now: Now, out: &mut Out) {
        self.respond(conn, seq, result, out);
        let session = self.sessions.get_mut(&conn).expect("finishing session");
        session.idle_since_ms = now.mono_ms;
        if session.closing {
            self.end_session(conn, "closed by the client", out);
        }
    }

    /// End the transaction keeping its changes; free its row locks.
    fn commit(&mut self, conn: ConnId) {
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.txn = None;
            session.aborted = false;
        }
        self.locks.retain(|lock, (owner, _)| !(matches!(lock, Lock::Row(..)) && *owner == conn));
    }

    /// End the transaction putting back what it changed; free its row locks.
    pub(super) fn rollback(&mut self, conn: ConnId) {
        let undo = self.sessions.get_mut(&conn).and_then(|s| s.txn.take()).unwrap_or_default();
        for Undo { table, key, before } in undo.into_iter().rev() {
            let rows = self.tables.get_mut(&table).expect("undo of an existing table");
            match before {
                Some(row) => rows.insert(key, row),
                None => rows.remove(&key),
            };
        }
        self.commit(conn);
    }

    /// Take `lock` for `conn`, or say who has it.
    fn take(&mut self, conn: ConnId, lock: Lock) -> Result<(), Lock> {
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

    fn undo(&mut self, conn: ConnId, table: &str, key: &str, before: Option<Row>) {
        let txn = self.sessions.get_mut(&conn).and_then(|s| s.txn.as_mut()).expect("changes happen in a transaction");
        txn.push(Undo { table: table.to_string(), key: key.to_string(), before });
    }

    /// The row an UPDATE or DELETE changes, locked, if it exists and meets `cond`; otherwise how the
    /// statement ends (no such table, no rows affected, or waiting for the row).
    fn matching_row(&mut self, conn: ConnId, table: &str, key: &str, cond: &[Cond], now: Now) -> Result<Row, Ran> {
        let Some(rows) = self.tables.get(table) else {
            return Err(Ran::Result(SqlResult::Error(SqlError::UndefinedTable)));
        };
        if !rows.contains_key(key) {
            return Err(Ran::Result(SqlResult::Affected(0)));
        }
        self.take(conn, Lock::Row(table.to_string(), key.to_string())).map_err(Ran::Blocked)?;
        let row = self.tables[table][key].clone();
        match cond.iter().all(|c| holds(c, &row, now)) {
            true => Ok(row),
            false => Err(Ran::Result(SqlResult::Affected(0))),
        }
    }

    fn statement(&mut self, conn: ConnId, stmt: &Stmt, now: Now) -> Ran {
        let row_lock = |table: &str, key: &str| Lock::Row(table.to_string(), key.to_string());
        let result = match stmt {
            Stmt::Begin => SqlResult::Done,
            Stmt::Commit => {
                let aborted = self.sessions[&conn].aborted;
                if aborted {
                    self.rollback(conn);
                } else {
                    self.commit(conn);
                }
                SqlResult::Done
            }
            Stmt::Rollback => {
                self.rollback(conn);
                SqlResult::Done
            }
            Stmt::Select { table, key, for_update } => {
                let Some(rows) = self.tables.get(table) else {
                    return Ran::Result(SqlResult::Error(SqlError::UndefinedTable));
                };
                let row = rows.get(key).cloned();
                if *for_update && row.is_some() {
                    if let Err(held) = self.take(conn, row_lock(table, key)) {
                        return Ran::Blocked(held);
                    }
                }
                SqlResult::Rows(row.into_iter().collect())
            }
            Stmt::Insert { table, key, row } => {
                let Some(rows) = self.tables.get(table) else {
                    return Ran::Result(SqlResult::Error(SqlError::UndefinedTable));
                };
                let exists = rows.contains_key(key);
                // A row another open transaction inserted (or is changing) waits for it to end.
                if let Err(held) = self.take(conn, row_lock(table, key)) {
                    return Ran::Blocked(held);
                }
                if exists {
                    SqlResult::Error(SqlError::UniqueViolation)
                } else {
                    let new: Row = row.iter().map(|(c, e)| (c.clone(), eval(e, None, now))).collect();
                    self.tables.get_mut(table).expect("checked").insert(key.clone(), new);
                    self.undo(conn, table, key, None);
                    SqlResult::Affected(1)
                }
            }
            Stmt::Update { table, key, set, cond } => match self.matching_row(conn, table, key, cond, now) {
                Ok(before) => {
                    let mut after = before.clone();
                    for (column, expr) in set {
                        after.insert(column.clone(), eval(expr, Some(&before), now));
                    }
                    self.tables.get_mut(table).expect("matched").insert(key.clone(), after);
                    self.undo(conn, table, key, Some(before));
                    SqlResult::Affected(1)
                }
                Err(ran) => return ran,
            },
            Stmt::Delete { table, key, cond } => match self.matching_row(conn, table, key, cond, now) {
                Ok(before) => {
                    self.tables.get_mut(table).expect("matched").remove(key);
                    self.undo(conn, table, key, Some(before));
                    SqlResult::Affected(1)
                }
                Err(ran) => return ran,
            },
            Stmt::NextVal { sequence } => match self.sequences.get_mut(sequence) {
                Some(n) => {
                    *n += 1;
                    SqlResult::Int(*n)
                }
                None => SqlResult::Error(SqlError::UndefinedTable),
            },
            Stmt::AdvisoryLock(key) => match self.take(conn, Lock::Advisory(*key)) {
                Ok(()) => SqlResult::Done,
                Err(held) => return Ran::Blocked(held),
            },
            Stmt::TryAdvisoryLock(key) => SqlResult::Bool(self.take(conn, Lock::Advisory(*key)).is_ok()),
            Stmt::AdvisoryUnlock(key) => match self.locks.get_mut(&Lock::Advisory(*key)) {
                Some((owner, count)) if *owner == conn => {
                    *count -= 1;
                    if *count == 0 {
                        self.locks.remove(&Lock::Advisory(*key));
                    }
                    SqlResult::Bool(true)
                }
                _ => SqlResult::Bool(false),
            },
            Stmt::SetLockTimeout(timeout) => {
                self.sessions.get_mut(&conn).expect("running").lock_timeout_ms = timeout.as_millis() as i64;
                SqlResult::Done
            }
        };
        Ran::Result(result)
    }
}
