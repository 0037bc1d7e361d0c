//! Statement tables against PostgreSQL's documented behaviour.

use super::*;

const A: ConnId = 1;
const B: ConnId = 2;
const C: ConnId = 3;

fn settings() -> Settings {
    Settings {
        tcp_keepalives_idle: Duration::from_secs(10),
        tcp_keepalives_interval: Duration::from_secs(1),
        tcp_keepalives_count: 3,
        idle_in_transaction_session_timeout: Duration::ZERO,
    }
}

fn db() -> SqlState {
    let mut db = SqlState::new(settings());
    let row = |n: i64| Row::from([("n".to_string(), Value::Int(n))]);
    db.create_table("lock_rows", [("lock".to_string(), row(0))]);
    db.create_table("locks", []);
    db.create_sequence("fence");
    for conn in [A, B, C] {
        db.apply(Now::at(0), NodeIx(conn as u32), SqlRequest::Connect { conn, incarnation: 0 }, &mut Out::default());
    }
    db
}

/// Run `stmt` on `conn` at `now`; the results pushed by this step, as (connection, result).
fn exec(db: &mut SqlState, now: i64, conn: ConnId, stmt: Stmt) -> Vec<(ConnId, SqlResult)> {
    let mut out = Out::default();
    db.apply(Now::at(now), NodeIx(conn as u32), SqlRequest::Execute { conn, seq: 1, stmt }, &mut out);
    pushed(out)
}

fn pushed(out: Out) -> Vec<(ConnId, SqlResult)> {
    out.pushes.into_iter().map(|(_, m)| m.downcast::<SqlResponse>().unwrap()).map(|r| (r.conn, r.result)).collect()
}

fn for_update() -> Stmt {
    Stmt::Select { table: "lock_rows".into(), key: "lock".into(), for_update: true }
}

fn insert(key: &str) -> Stmt {
    Stmt::Insert {
        table: "locks".into(),
        key: key.into(),
        row: vec![("owner".into(), Expr::Value(Value::Text("a".into())))],
    }
}

#[test]
fn select_for_update_waits_for_the_holder_and_waiters_go_in_order() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    assert!(matches!(&exec(&mut db, 0, A, for_update())[..], [(A, SqlResult::Rows(rows))] if rows.len() == 1));
    for conn in [B, C] {
        exec(&mut db, 1, conn, Stmt::Begin);
        assert_eq!(exec(&mut db, 1, conn, for_update()), vec![], "waits");
    }
    let woken = exec(&mut db, 2, A, Stmt::Commit);
    assert_eq!(woken.len(), 2, "A's commit answers, and B (first in line) gets the row: {woken:?}");
    assert_eq!((woken[0].0, woken[1].0), (A, B));
    assert_eq!(exec(&mut db, 3, B, Stmt::Rollback).iter().map(|r| r.0).collect::<Vec<_>>(), vec![B, C]);
}

#[test]
fn lock_timeout_fails_the_waiter_and_aborts_its_transaction() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    exec(&mut db, 0, B, Stmt::SetLockTimeout(Duration::from_millis(500)));
    exec(&mut db, 0, B, Stmt::Begin);
    assert_eq!(exec(&mut db, 0, B, for_update()), vec![]);
    let mut out = Out::default();
    db.tick(Now::at(400), &mut out);
    assert!(out.pushes.is_empty());
    db.tick(Now::at(500), &mut out);
    assert_eq!(pushed(out), vec![(B, SqlResult::Error(SqlError::LockTimeout))]);
    assert_eq!(
        exec(&mut db, 600, B, Stmt::NextVal { sequence: "fence".into() }),
        vec![(B, SqlResult::Error(SqlError::TransactionAborted))]
    );
    exec(&mut db, 700, B, Stmt::Rollback);
    assert_eq!(exec(&mut db, 800, B, Stmt::NextVal { sequence: "fence".into() }), vec![(B, SqlResult::Int(1))]);
}

#[test]
fn a_duplicate_insert_waits_for_the_first_and_fails_if_it_committed() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    assert_eq!(exec(&mut db, 0, A, insert("x")), vec![(A, SqlResult::Affected(1))]);
    assert_eq!(exec(&mut db, 0, B, insert("x")), vec![], "waits for A's transaction");
    let after = exec(&mut db, 1, A, Stmt::Commit);
    assert_eq!(after[1], (B, SqlResult::Error(SqlError::UniqueViolation)));
    // Rolled back instead, the row never existed.
    exec(&mut db, 2, A, Stmt::Begin);
    exec(&mut db, 2, A, insert("y"));
    assert_eq!(exec(&mut db, 2, B, insert("y")), vec![]);
    assert_eq!(exec(&mut db, 3, A, Stmt::Rollback)[1], (B, SqlResult::Affected(1)));
}

#[test]
fn conditional_updates_see_the_locked_row_and_the_server_clock() {
    let mut db = db();
    let take = || Stmt::Update {
        table: "lock_rows".into(),
        key: "lock".into(),
        set: vec![("n".into(), Expr::NowPlus(1000))],
        cond: vec![Cond { column: "n".into(), op: Op::Le, rhs: Expr::NowPlus(0) }],
    };
    assert_eq!(exec(&mut db, 5, A, take()), vec![(A, SqlResult::Affected(1))], "n = 0 <= now");
    assert_eq!(exec(&mut db, 500, B, take()), vec![(B, SqlResult::Affected(0))], "n = 1005 > now");
    assert_eq!(exec(&mut db, 1005, B, take()), vec![(B, SqlResult::Affected(1))]);
    let decrement = Stmt::Update {
        table: "lock_rows".into(),
        key: "lock".into(),
        set: vec![("n".into(), Expr::ColumnPlus("n".into(), -1))],
        cond: vec![Cond { column: "n".into(), op: Op::Gt, rhs: Expr::Value(Value::Int(2005)) }],
    };
    assert_eq!(exec(&mut db, 2000, C, decrement.clone()), vec![(C, SqlResult::Affected(0))], "2005 > 2005 is false");
}

#[test]
fn advisory_locks_wait_count_and_go_with_the_session() {
    let mut db = db();
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(7)), vec![(A, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 0, A, Stmt::TryAdvisoryLock(7)), vec![(A, SqlResult::Bool(true))], "held twice");
    assert_eq!(exec(&mut db, 0, B, Stmt::TryAdvisoryLock(7)), vec![(B, SqlResult::Bool(false))]);
    assert_eq!(exec(&mut db, 0, B, Stmt::AdvisoryLock(7)), vec![]);
    assert_eq!(exec(&mut db, 0, C, Stmt::AdvisoryUnlock(7)), vec![(C, SqlResult::Bool(false))], "not C's to unlock");
    assert_eq!(exec(&mut db, 1, A, Stmt::AdvisoryUnlock(7)), vec![(A, SqlResult::Bool(true))], "still held once");
    let mut out = Out::default();
    db.apply(Now::at(2), NodeIx(1), SqlRequest::Close { conn: A }, &mut out);
    assert_eq!(pushed(out), vec![(B, SqlResult::Done)], "A's session ended: B gets the lock");
}

/// PostgreSQL §9.27.10: a transaction-level hold ends with its transaction, stacks with a session-level
/// hold of the same key, and is not `pg_advisory_unlock`'s to release.
#[test]
fn transaction_advisory_locks_end_with_their_transaction_and_stack_with_the_sessions() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryXactLock(7)), vec![(A, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 0, B, Stmt::AdvisoryXactLock(7)), vec![], "B waits (autocommit)");
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryUnlock(7)), vec![(A, SqlResult::Bool(false))], "not unlock's");
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(7)), vec![(A, SqlResult::Done)], "A's session stacks on it");
    // A's commit ends the transaction's hold; its session's stays, so B still waits.
    assert_eq!(exec(&mut db, 1, A, Stmt::Commit), vec![(A, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 1, C, Stmt::TryAdvisoryXactLock(7)), vec![(C, SqlResult::Bool(false))]);
    // The session's hold released, B's autocommit statement takes the key and its end lets it go.
    assert_eq!(exec(&mut db, 2, A, Stmt::AdvisoryUnlock(7)), vec![(A, SqlResult::Bool(true)), (B, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 3, C, Stmt::TryAdvisoryXactLock(7)), vec![(C, SqlResult::Bool(true))], "autocommit: gone");
    // An error aborts the transaction at once and frees its hold, before the block's end.
    exec(&mut db, 4, A, Stmt::Begin);
    exec(&mut db, 4, A, Stmt::AdvisoryXactLock(8));
    exec(&mut db, 4, A, Stmt::Select { table: "nowhere".into(), key: "x".into(), for_update: false });
    assert_eq!(exec(&mut db, 5, B, Stmt::TryAdvisoryLock(8)), vec![(B, SqlResult::Bool(true))]);
}

#[test]
fn a_waiting_statement_whose_client_left_still_runs_and_commits() {
    let mut db = db();
    exec(&mut db, 0, B, insert("x")); // autocommit, committed
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, Stmt::Select { table: "locks".into(), key: "x".into(), for_update: true });
    let delete_x = Stmt::Delete { table: "locks".into(), key: "x".into(), cond: vec![] };
    assert_eq!(exec(&mut db, 0, B, delete_x), vec![], "waits for A's row");
    db.apply(Now::at(1), NodeIx(2), SqlRequest::Close { conn: B }, &mut Out::default());
    exec(&mut db, 2, A, Stmt::Commit);
    // B's delete ran (and committed) when A's row came free; then B's session ended.
    assert_eq!(exec(&mut db, 3, C, insert("x")), vec![(C, SqlResult::Affected(1))]);
    assert_eq!(exec(&mut db, 3, B, Stmt::Begin), vec![(B, SqlResult::Error(SqlError::Terminated))]);
}

/// Run the keep-alive timer at each of `times`, a probe of A's connection finding `answer` (the other
/// clients answer).
fn keepalive(db: &mut SqlState, times: impl IntoIterator<Item = i64>, answer: Probe) -> Out {
    keepalive_acked(db, times, answer, None)
}

/// [`keepalive`], A's kernel having acknowledged the server's data at `acked` (server ms).
fn keepalive_acked(db: &mut SqlState, times: impl IntoIterator<Item = i64>, answer: Probe, acked: Option<i64>) -> Out {
    let mut out = Out::default();
    let is_a = |node: NodeIx| node == NodeIx(A as u32);
    for now in times {
        let probe = |node, _| if is_a(node) { answer } else { Probe::Acked };
        db.keepalive(Now::at(now), probe, |node, _| acked.filter(|_| is_a(node)), &mut out);
    }
    out
}

#[test]
fn keepalive_ends_a_dead_session_after_idle_time_and_unanswered_probes() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    exec(&mut db, 0, B, for_update());
    keepalive(&mut db, [9_999], Probe::Unanswered);
    assert_eq!(db.sessions[&A].probes_out, 0, "nobody has been silent for tcp_keepalives_idle yet");
    // Probes at 10, 11 and 12 s go unanswered; at 13 s (idle + 3 × interval) the connection is reset.
    let out = keepalive(&mut db, [10_000, 11_000, 12_000, 12_999], Probe::Unanswered);
    assert!(db.sessions.contains_key(&A));
    assert!(out.pushes.is_empty());
    let out = keepalive(&mut db, [13_000], Probe::Unanswered);
    assert!(!db.sessions.contains_key(&A), "ended when the third probe, too, went unanswered");
    assert_eq!(pushed(out), vec![(B, SqlResult::Rows(vec![Row::from([("n".to_string(), Value::Int(0))])]))]);
}

#[test]
fn keepalive_says_when_a_sessions_timer_is_next_due() {
    // The kernel's timer is per connection and on time: the prober must wake at 10, 11, 12 and 13 s,
    // not at its next periodic look (which ended sessions up to half a second late).
    let mut db = db();
    let due = |db: &mut SqlState, now: i64| {
        let is_a = |node: NodeIx| node == NodeIx(A as u32);
        let probe = |node, _| if is_a(node) { Probe::Unanswered } else { Probe::Acked };
        db.keepalive(Now::at(now), probe, |_, _| None, &mut Out::default())
    };
    assert_eq!(due(&mut db, 0), Some(10_000), "idle for tcp_keepalives_idle from the connect");
    assert_eq!(due(&mut db, 10_000), Some(11_000), "B and C answered at 10 s (due at 20 s), A did not");
    assert_eq!(db.sessions[&A].probes_out, 1);
    assert_eq!(due(&mut db, 10_500), Some(11_000));
    assert_eq!(due(&mut db, 11_000), Some(12_000));
}

#[test]
fn an_answered_probe_restarts_the_full_idle_period() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    keepalive(&mut db, [10_000], Probe::Acked);
    // Silent from 10 s: the next probe is due at 20 s, so a cut from 10.1 s to 21.5 s is survived
    // (probes at 20 and 21 s unanswered, the one at 22 s answered).
    keepalive(&mut db, (101..=215).map(|t| t * 100), Probe::Unanswered);
    assert!(db.sessions.contains_key(&A));
    keepalive(&mut db, [22_000], Probe::Acked);
    assert_eq!(db.sessions[&A].probes_out, 0);
    keepalive(&mut db, (221..=320).map(|t| t * 100), Probe::Acked);
    assert!(db.sessions.contains_key(&A));
}

#[test]
fn the_last_keepalive_check_resets_the_connection_even_if_the_link_healed_after_the_last_probe() {
    // Linux `tcp_keepalive_timer`: the timer that finds `icsk_probes_out` >= `keepalive_probes`
    // resets the connection without sending another probe. An idle peer sends nothing that would
    // clear the count, so a cut that heals after the count-th probe went out (12 s) and before the
    // next check (13 s) still ends the session: measured on Linux + PostgreSQL 15 (idle 5 s,
    // interval 1 s, count 3: cuts healing at 7.4–7.9 s ended the session at 8.1–8.3 s).
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    keepalive(&mut db, [10_000, 11_000, 12_000], Probe::Unanswered);
    assert_eq!(db.sessions[&A].probes_out, 3);
    let out = keepalive(&mut db, [12_500], Probe::Acked);
    assert!(db.sessions.contains_key(&A), "no check before the interval is up");
    assert!(out.events.is_empty());
    let out = keepalive(&mut db, [13_000], Probe::Acked);
    assert!(!db.sessions.contains_key(&A), "the last check sends no probe: reset though the link is up");
    assert!(matches!(&out.events[0].1, EventKind::Session { state } if state.contains("probes unanswered")));
}

#[test]
fn an_acknowledged_result_counts_as_hearing_from_the_client() {
    // `keepalive_time_elapsed` counts idle time from the later of the last data and the last ACK
    // received: a statement sent at 0 s that waited 4 s for its lock, its result acknowledged at 4 s,
    // makes the connection idle from 4 s, so the probes go out at 14, 15 and 16 s and the reset comes
    // at 17 s — counting from the statement, a cut from 4.1 s to 13.5 s would have ended it at 13 s.
    // (Real PostgreSQL: a session whose last statement waited 4 s survived a 6.2 s cut with idle 5 s,
    // interval 1 s, count 3.)
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    keepalive_acked(&mut db, (41..=135).map(|t| t * 100), Probe::Unanswered, Some(4_000));
    assert!(db.sessions.contains_key(&A), "idle only since the result's ACK at 4 s");
    assert_eq!(db.sessions[&A].probes_out, 0);
    keepalive_acked(&mut db, (136..=165).map(|t| t * 100), Probe::Unanswered, Some(4_000));
    assert_eq!(db.sessions[&A].probes_out, 3, "probes at 14, 15 and 16 s");
    keepalive_acked(&mut db, [17_000], Probe::Acked, Some(4_000));
    assert!(!db.sessions.contains_key(&A), "the last check at 17 s");
}

#[test]
fn a_waiting_statement_whose_connection_keepalive_ended_is_granted_then_its_session_ends() {
    // PostgreSQL's backend sleeps on its latch (`ProcSleep`), not on the socket: it notices the
    // dead connection only when it sends the result (`internal_flush` sets `ClientConnectionLost`),
    // and the next `CHECK_FOR_INTERRUPTS` ends the session.
    let mut db = db();
    exec(&mut db, 0, B, Stmt::Begin);
    exec(&mut db, 0, B, for_update());
    exec(&mut db, 0, A, Stmt::Begin);
    assert_eq!(exec(&mut db, 0, A, for_update()), vec![], "A waits for B");
    exec(&mut db, 0, C, Stmt::Begin);
    assert_eq!(exec(&mut db, 0, C, for_update()), vec![], "C waits behind A");
    keepalive(&mut db, (100..=130).map(|t| t * 100), Probe::Unanswered);
    assert!(db.sessions.contains_key(&A), "the connection is gone, the backend still waits");
    assert_eq!(db.waits_for()[&C], vec![B, A], "and keeps its place in line");
    // B commits: A is granted, runs, fails to send, and its session ends; C goes on.
    let mut out = Out::default();
    db.apply(Now::at(14_000), NodeIx(B as u32), SqlRequest::Execute { conn: B, seq: 2, stmt: Stmt::Commit }, &mut out);
    assert!(!db.sessions.contains_key(&A));
    let results = pushed(out);
    assert!(results.iter().any(|(c, r)| *c == C && matches!(r, SqlResult::Rows(_))), "{results:?}");
}

#[test]
fn a_client_process_that_dies_ends_its_session_at_once() {
    // Its kernel closes the connection; the backend reads EOF and exits, rolling back.
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    assert_eq!(exec(&mut db, 0, B, for_update()), vec![], "B waits");
    let mut out = Out::default();
    db.connection_closed(Now::at(100), NodeIx(A as u32), 1, &mut out);
    assert!(db.sessions.contains_key(&A), "another life of the client's node: not its connection");
    db.connection_closed(Now::at(100), NodeIx(A as u32), 0, &mut out);
    assert!(!db.sessions.contains_key(&A));
    assert!(matches!(&pushed(out)[..], [(B, SqlResult::Rows(_))]), "B is granted at once");
}

#[test]
fn a_restarted_client_host_resets_the_connection_at_the_first_probe() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    keepalive(&mut db, [9_000], Probe::Reset);
    assert!(db.sessions.contains_key(&A), "no probe before the idle time");
    let out = keepalive(&mut db, [10_000], Probe::Reset);
    assert!(!db.sessions.contains_key(&A));
    assert!(matches!(&out.events[0].1, EventKind::Session { state } if state.contains("reset")));
}

#[test]
fn no_probes_while_data_is_unacknowledged_until_retransmissions_give_up() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    keepalive(&mut db, (10..100).map(|t| t * 1000), Probe::Retransmitting { gave_up: false });
    assert!(db.sessions.contains_key(&A));
    assert_eq!(db.sessions[&A].probes_out, 0);
    keepalive(&mut db, [100_000], Probe::Retransmitting { gave_up: true });
    assert!(!db.sessions.contains_key(&A));
}

#[test]
fn idle_in_transaction_timeout_ends_the_session() {
    let mut db = SqlState::new(Settings { idle_in_transaction_session_timeout: Duration::from_secs(5), ..settings() });
    db.create_table("lock_rows", [("lock".to_string(), Row::new())]);
    db.apply(Now::at(0), NodeIx(1), SqlRequest::Connect { conn: A, incarnation: 0 }, &mut Out::default());
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    let mut out = Out::default();
    db.tick(Now::at(4_900), &mut out);
    assert!(db.sessions.contains_key(&A));
    db.tick(Now::at(5_000), &mut out);
    assert!(!db.sessions.contains_key(&A));
    assert!(matches!(&out.events[0].1, EventKind::Session { state } if state.contains("idle in transaction")));
}

fn tick(db: &mut SqlState, now: i64) -> Vec<(ConnId, SqlResult)> {
    let mut out = Out::default();
    db.tick(Now::at(now), &mut out);
    pushed(out)
}

fn select(key: &str, for_update: bool) -> Stmt {
    Stmt::Select { table: "locks".into(), key: key.into(), for_update }
}

fn set_owner(key: &str, cond: Vec<Cond>) -> Stmt {
    Stmt::Update {
        table: "locks".into(),
        key: key.into(),
        set: vec![("owner".into(), Expr::Value(Value::Text("b".into())))],
        cond,
    }
}

#[test]
fn another_transactions_uncommitted_insert_is_invisible_but_an_insert_of_its_key_waits() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, insert("x"));
    assert_eq!(exec(&mut db, 1, B, select("x", true)), vec![(B, SqlResult::Rows(vec![]))], "no row, no wait");
    assert_eq!(exec(&mut db, 1, B, set_owner("x", vec![])), vec![(B, SqlResult::Affected(0))]);
    assert_eq!(exec(&mut db, 1, A, select("x", false)).len(), 1, "A sees its own insert");
    assert_eq!(exec(&mut db, 1, B, insert("x")), vec![], "the unique check waits for A");
    let done = exec(&mut db, 2, A, Stmt::Commit);
    assert_eq!(done[1], (B, SqlResult::Error(SqlError::UniqueViolation)));
}

#[test]
fn an_insert_of_a_committed_key_that_is_only_locked_fails_at_once() {
    let mut db = db();
    exec(&mut db, 0, B, insert("x"));
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, select("x", true));
    assert_eq!(exec(&mut db, 1, B, insert("x")), vec![(B, SqlResult::Error(SqlError::UniqueViolation))]);
}

#[test]
fn an_update_whose_condition_fails_on_the_row_it_sees_does_not_wait() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    let big = Cond { column: "n".into(), op: Op::Gt, rhs: Expr::Value(Value::Int(10)) };
    let update = Stmt::Update { table: "lock_rows".into(), key: "lock".into(), set: vec![], cond: vec![big] };
    assert_eq!(exec(&mut db, 1, B, update), vec![(B, SqlResult::Affected(0))]);
}

#[test]
fn a_waiter_looks_again_at_the_rows_newest_version_and_not_at_a_new_row() {
    let mut db = db();
    exec(&mut db, 0, B, insert("x"));
    let owner_is =
        |who: &str| vec![Cond { column: "owner".into(), op: Op::Eq, rhs: Expr::Value(Value::Text(who.into())) }];
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, set_owner("x", vec![]));
    assert_eq!(exec(&mut db, 1, C, set_owner("x", owner_is("a"))), vec![], "owner a as C sees it: waits");
    exec(&mut db, 1, B, Stmt::Begin);
    assert_eq!(exec(&mut db, 1, B, select("x", true)), vec![], "waits behind C");
    let done = exec(&mut db, 2, A, Stmt::Commit);
    // C's condition, checked again on A's version (owner b), fails; B gets the row.
    assert_eq!(done[..2], [(A, SqlResult::Done), (C, SqlResult::Affected(0))]);
    assert!(matches!(&done[2], (B, SqlResult::Rows(rows)) if rows[0]["owner"] == Value::Text("b".into())));
    // Deleted and inserted again by one transaction: a waiter's row is gone, the new one is not its.
    let mut db = self::db();
    exec(&mut db, 0, B, insert("x"));
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, Stmt::Delete { table: "locks".into(), key: "x".into(), cond: vec![] });
    exec(&mut db, 0, A, insert("x"));
    assert_eq!(exec(&mut db, 1, C, select("x", true)), vec![]);
    assert_eq!(exec(&mut db, 2, A, Stmt::Commit)[1], (C, SqlResult::Rows(vec![])));
}

#[test]
fn an_error_in_a_transaction_frees_its_rows_at_once_and_commit_rolls_it_back() {
    let mut db = db();
    exec(&mut db, 0, B, insert("x"));
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    exec(&mut db, 0, A, Stmt::AdvisoryLock(1));
    assert_eq!(exec(&mut db, 1, C, for_update()), vec![]);
    let failed = exec(&mut db, 2, A, insert("x"));
    assert_eq!(
        failed,
        vec![
            (A, SqlResult::Error(SqlError::UniqueViolation)),
            (C, SqlResult::Rows(vec![Row::from([("n".to_string(), Value::Int(0))])]))
        ]
    );
    assert_eq!(exec(&mut db, 3, A, select("x", false)), vec![(A, SqlResult::Error(SqlError::TransactionAborted))]);
    assert_eq!(exec(&mut db, 4, A, Stmt::Commit), vec![(A, SqlResult::RolledBack)]);
    assert_eq!(exec(&mut db, 5, B, Stmt::TryAdvisoryLock(1)), vec![(B, SqlResult::Bool(false))], "session locks stay");
}

#[test]
fn lock_timeout_starts_again_when_a_row_waiter_becomes_first_in_line_but_not_for_advisory_locks() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    exec(&mut db, 0, B, Stmt::Begin);
    exec(&mut db, 0, B, for_update());
    exec(&mut db, 0, C, Stmt::SetLockTimeout(Duration::from_millis(500)));
    exec(&mut db, 0, C, Stmt::Begin);
    assert_eq!(exec(&mut db, 100, C, for_update()), vec![]);
    exec(&mut db, 400, A, Stmt::Commit);
    assert_eq!(tick(&mut db, 600), vec![], "C sleeps again on B from 400 ms");
    assert_eq!(tick(&mut db, 900), vec![(C, SqlResult::Error(SqlError::LockTimeout))]);
    let mut db = self::db();
    exec(&mut db, 0, A, Stmt::AdvisoryLock(1));
    exec(&mut db, 0, B, Stmt::AdvisoryLock(1));
    exec(&mut db, 0, C, Stmt::SetLockTimeout(Duration::from_millis(500)));
    exec(&mut db, 100, C, Stmt::AdvisoryLock(1));
    exec(&mut db, 400, A, Stmt::AdvisoryUnlock(1));
    assert_eq!(tick(&mut db, 600), vec![(C, SqlResult::Error(SqlError::LockTimeout))], "one sleep from 100 ms");
}

#[test]
fn now_is_the_transactions_start_even_for_a_statement_that_waited() {
    let mut db = db();
    exec(&mut db, 0, B, insert("x"));
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, select("x", true));
    let stamp = Stmt::Update {
        table: "locks".into(),
        key: "x".into(),
        set: vec![("until".into(), Expr::NowPlus(0))],
        cond: vec![],
    };
    assert_eq!(exec(&mut db, 100, B, stamp), vec![]);
    exec(&mut db, 700, A, Stmt::Commit);
    let row = exec(&mut db, 800, C, select("x", false));
    assert!(matches!(&row[0].1, SqlResult::Rows(r) if r[0]["until"] == Value::Int(100)), "{row:?}");
}

#[test]
fn a_crash_keeps_a_sequence_past_what_it_flushed_and_loses_what_it_did_not() {
    let mut db = db();
    let nextval = || Stmt::NextVal { sequence: "fence".into() };
    assert_eq!(exec(&mut db, 0, A, nextval()), vec![(A, SqlResult::Int(1))], "logs 33, committed: flushed");
    exec(&mut db, 0, A, nextval());
    db.recover();
    connect_all(&mut db);
    assert_eq!(exec(&mut db, 1, A, nextval()), vec![(A, SqlResult::Int(34))], "logs 66 (a checkpoint ended recovery)");
    exec(&mut db, 1, B, Stmt::Begin);
    assert!(!db.sequence_unflushed());
    db.recover();
    connect_all(&mut db);
    exec(&mut db, 2, B, Stmt::Begin);
    assert_eq!(exec(&mut db, 2, B, nextval()), vec![(B, SqlResult::Int(67))], "logs 99, uncommitted");
    assert!(db.sequence_unflushed());
    db.recover();
    connect_all(&mut db);
    assert_eq!(exec(&mut db, 3, A, nextval()), vec![(A, SqlResult::Int(67))], "67 again: a token handed out twice");
}

fn connect_all(db: &mut SqlState) {
    for conn in [A, B, C] {
        db.apply(Now::at(0), NodeIx(conn as u32), SqlRequest::Connect { conn, incarnation: 1 }, &mut Out::default());
    }
}

#[test]
fn a_session_sets_its_own_idle_in_transaction_timeout() {
    let mut db = db();
    exec(&mut db, 0, A, Stmt::SetIdleInTransactionSessionTimeout(Duration::from_millis(250)));
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, B, Stmt::Begin);
    tick(&mut db, 300);
    assert_eq!(exec(&mut db, 400, A, Stmt::Commit), vec![(A, SqlResult::Error(SqlError::Terminated))]);
    assert_eq!(exec(&mut db, 400, B, Stmt::Commit), vec![(B, SqlResult::Done)], "the server's default: never");
}

#[test]
fn a_users_own_table_and_sequence_are_created_once_and_survive_a_restart() {
    let mut db = db();
    let table = |if_not_exists| Stmt::CreateTable { table: "job_locks".into(), if_not_exists };
    let select = Stmt::Select { table: "job_locks".into(), key: "nightly".into(), for_update: true };
    assert_eq!(exec(&mut db, 0, A, select.clone()), vec![(A, SqlResult::Error(SqlError::UndefinedTable))]);
    assert_eq!(exec(&mut db, 0, A, table(false)), vec![(A, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 0, B, table(false)), vec![(B, SqlResult::Error(SqlError::DuplicateTable))]);
    assert_eq!(exec(&mut db, 0, B, table(true)), vec![(B, SqlResult::Done)], "IF NOT EXISTS: a notice, no error");
    let row = vec![("owner".to_string(), Expr::Value(Value::Null))];
    let insert = Stmt::Insert { table: "job_locks".into(), key: "nightly".into(), row };
    assert_eq!(exec(&mut db, 0, A, insert), vec![(A, SqlResult::Affected(1))]);
    let sequence = |if_not_exists| Stmt::CreateSequence { sequence: "job_fence".into(), if_not_exists };
    assert_eq!(exec(&mut db, 0, A, sequence(true)), vec![(A, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 0, A, sequence(false)), vec![(A, SqlResult::Error(SqlError::DuplicateTable))]);
    assert_eq!(exec(&mut db, 0, A, Stmt::NextVal { sequence: "job_fence".into() }), vec![(A, SqlResult::Int(1))]);
    db.recover();
    db.apply(Now::at(1), NodeIx(3), SqlRequest::Connect { conn: C, incarnation: 1 }, &mut Out::default());
    assert!(
        matches!(&exec(&mut db, 1, C, select)[..], [(C, SqlResult::Rows(rows))] if rows.len() == 1),
        "the table and its committed row outlive the crash"
    );
}

#[test]
fn insert_on_conflict_do_nothing_waits_for_an_uncommitted_insert_then_inserts_nothing_without_error() {
    let mut db = db();
    let nothing = |key: &str| match insert(key) {
        Stmt::Insert { table, key, row } => Stmt::InsertOnConflictDoNothing { table, key, row },
        _ => unreachable!(),
    };
    exec(&mut db, 0, A, Stmt::Begin);
    assert_eq!(exec(&mut db, 0, A, nothing("job")), vec![(A, SqlResult::Affected(1))]);
    exec(&mut db, 0, B, Stmt::Begin);
    assert_eq!(exec(&mut db, 1, B, nothing("job")), vec![], "waits for A's uncommitted insert of the key");
    let woken = exec(&mut db, 2, A, Stmt::Commit);
    assert_eq!(woken, vec![(A, SqlResult::Done), (B, SqlResult::Affected(0))], "then nothing: the key is taken");
    assert_eq!(exec(&mut db, 3, B, nothing("other")), vec![(B, SqlResult::Affected(1))], "B's transaction goes on");
    assert_eq!(exec(&mut db, 3, B, Stmt::Commit), vec![(B, SqlResult::Done)]);
    // A rolled-back insert leaves the key free.
    exec(&mut db, 4, A, Stmt::Begin);
    exec(&mut db, 4, A, nothing("late"));
    assert_eq!(exec(&mut db, 5, C, nothing("late")), vec![]);
    assert_eq!(exec(&mut db, 6, A, Stmt::Rollback), vec![(A, SqlResult::Done), (C, SqlResult::Affected(1))]);
    assert_eq!(exec(&mut db, 7, B, insert("late")), vec![(B, SqlResult::Error(SqlError::UniqueViolation))]);
}

#[test]
fn sql_text_runs_as_the_statement_it_stands_for() {
    let mut db = db();
    let mut schema = text::Schema::new();
    schema.parse("CREATE TABLE locks (k varchar(64), owner text, PRIMARY KEY (k))").unwrap();
    let take = schema.prepare("INSERT INTO locks VALUES ($1, $2) ON CONFLICT DO NOTHING").unwrap();
    let stmt = take.bind(&[&"job", &"a"]).unwrap();
    assert!(matches!(&stmt, Stmt::Text(t) if t.sql == take.sql() && t.params.len() == 2));
    assert_eq!(exec(&mut db, 0, A, stmt.clone()), vec![(A, SqlResult::Affected(1))]);
    assert_eq!(exec(&mut db, 0, B, stmt), vec![(B, SqlResult::Affected(0))]);
}

/// A server behind pgbouncer in `mode` with `size` backends, and clients A, B and C connected to it.
fn pooled(mode: PoolMode, size: usize) -> SqlState {
    pooled_with(Pooler { size, ..Pooler::new(mode) })
}

fn pooled_with(pooler: Pooler) -> SqlState {
    let mut db = SqlState::new(settings()).with_pooler(pooler);
    db.create_table("lock_rows", [("lock".to_string(), Row::new())]);
    db.create_sequence("fence");
    for conn in [A, B, C] {
        db.apply(Now::at(0), NodeIx(conn as u32), SqlRequest::Connect { conn, incarnation: 0 }, &mut Out::default());
    }
    db
}

/// Run `stmt` on `conn` at `now`; the results pushed and the hazards marked by this step.
fn exec_marked(db: &mut SqlState, now: i64, conn: ConnId, stmt: Stmt) -> (Vec<(ConnId, SqlResult)>, Vec<Hazard>) {
    let mut out = Out::default();
    db.apply(Now::at(now), NodeIx(conn as u32), SqlRequest::Execute { conn, seq: 1, stmt }, &mut out);
    let marks = std::mem::take(&mut out.marks);
    (pushed(out), marks)
}

#[test]
fn transaction_pooling_hands_a_session_advisory_lock_to_the_next_client() {
    let mut db = pooled(PoolMode::Transaction, 20);
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(42)), vec![(A, SqlResult::Done)]);
    // A's backend went back to the pool with A's lock on it; B is handed the same one (last released
    // first), whose session holds the key: granted at once, counted twice.
    let (granted, marks) = exec_marked(&mut db, 1, B, Stmt::AdvisoryLock(42));
    assert_eq!(granted, vec![(B, SqlResult::Done)]);
    assert_eq!(marks, vec![Hazard::PooledSessionLock]);
    // With another backend busy in a transaction, A's unlock lands on a second backend, which holds
    // nothing: false, and the key stays held.
    exec(&mut db, 2, C, Stmt::Begin);
    assert_eq!(exec(&mut db, 3, A, Stmt::AdvisoryUnlock(42)), vec![(A, SqlResult::Bool(false))]);
}

#[test]
fn session_pooling_keeps_a_backend_per_client_and_discards_its_locks_when_it_leaves() {
    let mut db = pooled(PoolMode::Session, 20);
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(42)), vec![(A, SqlResult::Done)]);
    assert_eq!(exec(&mut db, 1, B, Stmt::AdvisoryLock(42)), vec![], "B's own backend waits");
    // A disconnects: its backend runs DISCARD ALL (unlocking the key) and goes back to the pool.
    let mut out = Out::default();
    db.apply(Now::at(2), NodeIx(A as u32), SqlRequest::Close { conn: A }, &mut out);
    assert_eq!(pushed(out), vec![(B, SqlResult::Done)]);
    // C is handed A's old backend, which holds nothing now.
    let (took, marks) = exec_marked(&mut db, 3, C, Stmt::TryAdvisoryLock(42));
    assert_eq!((took, marks), (vec![(C, SqlResult::Bool(false))], vec![]));
}

#[test]
fn a_client_that_leaves_inside_a_transaction_takes_its_backend_and_row_lock_with_it() {
    let mut db = pooled(PoolMode::Transaction, 20);
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, A, for_update());
    exec(&mut db, 1, B, Stmt::Begin);
    assert_eq!(exec(&mut db, 1, B, for_update()), vec![], "waits for A's row lock");
    let mut out = Out::default();
    db.apply(Now::at(2), NodeIx(A as u32), SqlRequest::Close { conn: A }, &mut out);
    assert!(matches!(&pushed(out)[..], [(B, SqlResult::Rows(_))]), "pgbouncer closed A's backend: rolled back");
}

#[test]
fn a_full_pool_makes_a_client_wait_for_a_backend_first_come_first_served() {
    let mut db = pooled(PoolMode::Transaction, 1);
    exec(&mut db, 0, A, Stmt::Begin);
    assert_eq!(exec(&mut db, 1, B, Stmt::NextVal { sequence: "fence".into() }), vec![], "no backend free");
    assert_eq!(exec(&mut db, 2, C, Stmt::Begin), vec![]);
    // A's commit frees the one backend: B's statement runs, then C's.
    let after = exec(&mut db, 3, A, Stmt::Commit);
    assert_eq!(after.iter().map(|r| r.0).collect::<Vec<_>>(), vec![A, B, C]);
}

#[test]
fn a_backend_closed_under_a_departing_client_frees_its_place_in_the_pool() {
    let mut db = pooled(PoolMode::Transaction, 1);
    exec(&mut db, 0, A, Stmt::Begin);
    assert_eq!(exec(&mut db, 1, B, Stmt::TryAdvisoryLock(42)), vec![], "the one backend is A's");
    // A leaves inside its transaction: pgbouncer closes its backend and opens another for B.
    let mut out = Out::default();
    db.apply(Now::at(2), NodeIx(A as u32), SqlRequest::Close { conn: A }, &mut out);
    assert_eq!(pushed(out), vec![(B, SqlResult::Bool(true))]);
}

#[test]
fn server_reset_query_always_frees_a_session_lock_as_its_backend_goes_back() {
    let mut db = pooled_with(Pooler { reset_always: true, ..Pooler::new(PoolMode::Transaction) });
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(42)), vec![(A, SqlResult::Done)]);
    // DISCARD ALL ran as A's backend went back: B, handed it, finds the key free.
    let (took, marks) = exec_marked(&mut db, 1, B, Stmt::TryAdvisoryLock(42));
    assert_eq!((took, marks), (vec![(B, SqlResult::Bool(true))], vec![]));
}

/// The pooler's janitor at `now` (the server's tick): the leases it ended.
fn janitor(db: &mut SqlState, now: i64) -> Vec<(NodeIx, u64, bool)> {
    let mut out = Out::default();
    db.tick(Now::at(now), &mut out);
    out.leases
}

#[test]
fn server_idle_timeout_closes_an_unused_backend_and_frees_the_session_lock_left_on_it() {
    let mut db = pooled_with(Pooler { idle_timeout: Duration::from_secs(10), ..Pooler::new(PoolMode::Transaction) });
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(42)), vec![(A, SqlResult::Done)]);
    // Idle exactly the timeout: kept (pgbouncer closes one idle *more* than it).
    assert_eq!(janitor(&mut db, 10_000), vec![]);
    // Then closed: its session ends, A's lock with it, while A believes it holds.
    assert_eq!(janitor(&mut db, 10_100), vec![(NodeIx(A as u32), A, false)]);
    assert_eq!(exec(&mut db, 10_200, B, Stmt::TryAdvisoryLock(42)), vec![(B, SqlResult::Bool(true))]);
}

#[test]
fn a_wall_clock_stepped_back_closes_unused_backends_as_their_unsigned_ages_wrap() {
    let mut db = pooled_with(Pooler::new(PoolMode::Transaction));
    exec(&mut db, 10_000, A, Stmt::AdvisoryLock(42));
    let mut out = Out::default();
    db.tick(Now { wall_ms: 10_500, mono_ms: 10_500 }, &mut out);
    assert_eq!(out.leases, vec![], "half a second idle: kept");
    // The database host's clock steps back 5 s: pgbouncer's `now - request_time` wraps.
    db.tick(Now { wall_ms: 5_600, mono_ms: 10_600 }, &mut out);
    assert_eq!(out.leases, vec![(NodeIx(A as u32), A, false)]);
}

#[test]
fn neither_timeout_closes_a_backend_linked_to_its_session_pooled_client() {
    let short =
        Pooler { idle_timeout: Duration::from_secs(1), lifetime: Duration::ZERO, ..Pooler::new(PoolMode::Session) };
    let mut db = pooled_with(short);
    assert_eq!(exec(&mut db, 0, A, Stmt::AdvisoryLock(42)), vec![(A, SqlResult::Done)]);
    assert_eq!(janitor(&mut db, 60_000), vec![]);
    assert_eq!(exec(&mut db, 60_100, B, Stmt::TryAdvisoryLock(42)), vec![(B, SqlResult::Bool(false))]);
}

#[test]
fn server_lifetime_closes_a_backend_as_it_is_released_and_spaces_the_janitors_closes() {
    // Lifetime zero: each backend serves one transaction, and A's lock goes with it.
    let mut db = pooled_with(Pooler { lifetime: Duration::ZERO, ..Pooler::new(PoolMode::Transaction) });
    exec(&mut db, 0, A, Stmt::AdvisoryLock(42));
    assert_eq!(exec(&mut db, 1, B, Stmt::TryAdvisoryLock(42)), vec![(B, SqlResult::Bool(true))]);
    // Two backends of a pool of 2, left unused past a 10 s lifetime: one is closed, and the other
    // only lifetime / pool size (5 s) after it.
    let pooler = Pooler { size: 2, lifetime: Duration::from_secs(10), ..Pooler::new(PoolMode::Transaction) };
    let mut db = pooled_with(pooler);
    exec(&mut db, 0, A, Stmt::Begin);
    exec(&mut db, 0, B, Stmt::AdvisoryLock(7));
    exec(&mut db, 1, A, Stmt::AdvisoryLock(8));
    exec(&mut db, 2, A, Stmt::Commit);
    let closed = |leases: Vec<(NodeIx, u64, bool)>| leases.len();
    assert_eq!(closed(janitor(&mut db, 10_000)), 1);
    assert_eq!(closed(janitor(&mut db, 14_900)), 0);
    assert_eq!(closed(janitor(&mut db, 15_000)), 1);
}
