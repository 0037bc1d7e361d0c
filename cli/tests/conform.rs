//! Conformance against the real servers (installed by `.ci/install-servers`). Where a server is not
//! installed these tests say so and pass, unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run`
//! sets it, so that in CI a missing server fails rather than skips.

mod common;

use common::{locksim, stderr, stdout};
use locksim_live::conform::etcd::Etcd;
use locksim_live::conform::redis::Redis;
use locksim_live::conform::sql::pgbouncer::Pgbouncer;
use locksim_live::conform::sql::{self, Sql};
use locksim_live::conform::zk::Zk;
use locksim_live::conform::{check, compare, replay_alone, script_for, Action, Family, Outcome, Recover, Step};
use locksim_live::servers::ZK_TICK_MS as TICK_MS;
use locksim_live::servers::{self, Launcher, Server};
use locksim_sim::backend::etcd::{EtcdRequest, EtcdState, Op as KvOp};
use locksim_sim::backend::redis::{RedisRequest, RedisState, SetCondition};
use locksim_sim::backend::sql::{Cond, Expr, Op as CmpOp, SqlRequest, Stmt, Value};
use locksim_sim::backend::zk::{CreateMode, ZkOp, ZkRequest, ZkState};
use locksim_sim::backend::{Backend, Now, Out};
use locksim_sim::history::NodeIx;
use std::time::Duration;

/// The tests that play scripts take turns: a script keeps time, and a busy machine makes it inconclusive.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `launcher`'s server, or `None` (said on stderr) where it is not installed and not required.
fn server(launcher: &'static Launcher) -> Option<Server> {
    match Server::start(launcher) {
        Ok(server) => Some(server),
        Err(e) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!("skipped: {e:#} (set LOCKSIM_REQUIRE_SERVERS=1 to make this a failure)");
            None
        }
        Err(e) => panic!("{e:#}"),
    }
}

/// The first mismatch a planted bug shows within the CI seed budget of `.ci/run` (which starts at seed
/// 0): the seed, the script as printed, the step, and both answers. `shrunk`: shrunk as `conform`
/// prints it. Shrinking replays the script against the real server up to 40 times, each taking the
/// script's real time, so only the test about shrinking asks for it. Only seeds whose script the
/// planted bug answers otherwise than the faithful model are played for real: on the others the real
/// server, which agrees with the faithful model (the `conform_*_agrees` tests), cannot tell them apart.
fn caught<F: Family + Default>(
    broken: &F,
    server: &mut Server,
    shrunk: bool,
) -> (u64, Vec<String>, usize, String, String) {
    let faithful = F::default();
    let bent = |seed: &u64| {
        let steps = script_for::<F>(server, *seed);
        broken.model(&steps) != faithful.model(&steps)
    };
    let seeds: Vec<u64> = (0..10).filter(bent).collect();
    let found = seeds.into_iter().find_map(|seed| {
        let outcome = match shrunk {
            true => check(broken, server, seed),
            false => compare(broken, server, &script_for::<F>(server, seed)),
        };
        match outcome.unwrap() {
            Outcome::Mismatch { steps, step, model, real, .. } => {
                Some((seed, steps.iter().map(ToString::to_string).collect(), step, model, real))
            }
            _ => None,
        }
    });
    found.expect("the planted bug is caught within 10 seeds")
}

/// A planted bug: the model `B` with each request bent by `bend` before it is applied.
struct Planted<B: Backend> {
    model: B,
    bend: fn(&mut B::Request),
}

impl<B: Recover> Backend for Planted<B> {
    type Request = B::Request;
    type Reply = B::Reply;

    fn apply(&mut self, now: Now, from: NodeIx, mut request: B::Request, out: &mut Out) -> B::Reply {
        (self.bend)(&mut request);
        self.model.apply(now, from, request, out)
    }

    fn tick_interval(&self) -> Option<Duration> {
        self.model.tick_interval()
    }

    fn ticks_from(&self) -> Option<i64> {
        self.model.ticks_from()
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        self.model.tick(now, out)
    }

    fn connection_closed(&mut self, now: Now, peer: NodeIx, life: u32, out: &mut Out) {
        self.model.connection_closed(now, peer, life, out)
    }

    fn parks(&self, request: &B::Request) -> Option<Duration> {
        self.model.parks(request)
    }

    fn answer_parked(&mut self, from: NodeIx, request: &B::Request, timed_out: bool) -> Option<B::Reply> {
        self.model.answer_parked(from, request, timed_out)
    }
}

impl<B: Recover> Recover for Planted<B> {
    fn recover(&mut self, now_ms: i64) {
        self.model.recover(now_ms)
    }
}

/// A planted bug: `SET … NX` overwrites a key that exists.
fn set_nx_overwrites(request: &mut RedisRequest) {
    if let RedisRequest::Set { condition: c @ SetCondition::Nx, .. } = request {
        *c = SetCondition::Always;
    }
}

#[test]
fn a_set_nx_that_overwrites_is_caught_and_shrunk_to_the_two_sets() {
    let _turn = turn();
    let Some(mut server) = server(&servers::REDIS) else { return };
    let broken = Redis { model: || Box::new(Planted { model: RedisState::default(), bend: set_nx_overwrites }) };
    let (seed, shown, step, model, real) = caught(&broken, &mut server, true);
    assert!(shown[step].contains("NX"), "seed {seed}: the mismatch is at a SET NX: {shown:#?}");
    assert_eq!((model.as_str(), real.as_str()), ("OK", "nil"), "seed {seed}: {shown:#?}");
    let requests = shown.iter().filter(|s| s.contains("client-")).count();
    assert!(requests <= 3, "seed {seed}: shrunk to the writes that matter: {shown:#?}");
}

#[test]
fn conform_redis_agrees_with_the_real_server_and_says_what_it_played() {
    let _turn = turn();
    if server(&servers::REDIS).is_none() {
        return;
    }
    let o = locksim(&["conform", "redis", "--seeds", "0..4"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    // A seed may be inconclusive on a busy machine; none may mismatch.
    assert!(out.contains("redis: 4 seeds (seeds 0..4): ") && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(out.contains("SET NX") && out.contains("PTTL") && out.contains("restart"), "{out}");
}

#[test]
fn a_server_that_will_not_start_is_one_clear_error_and_exit_2() {
    let o = common::locksim_with_env(&["conform", "redis", "--seeds", "0..1"], "LOCKSIM_REDIS_SERVER", "/nonexistent");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), "locksim: LOCKSIM_REDIS_SERVER=/nonexistent: no such program\n");
    let o = common::locksim_with_env(&["conform", "redis", "--seeds", "0..1"], "LOCKSIM_REDIS_SERVER", "/bin/false");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("redis-server exited (exit status: 1) before it answered"), "{}", stderr(&o));
}

/// A planted bug: a range ignores its limit (the `Mutex` recipe finds the key ahead of it by limit 1).
fn range_ignores_limit(request: &mut EtcdRequest) {
    if let EtcdRequest::Op(KvOp::Range(r)) = request {
        r.limit = 0;
    }
}

#[test]
fn an_etcd_range_that_ignores_its_limit_is_caught() {
    let _turn = turn();
    let Some(mut server) = server(&servers::ETCD) else { return };
    let broken = Etcd { model: || Box::new(Planted { model: EtcdState::default(), bend: range_ignores_limit }) };
    let (seed, shown, step, _, _) = caught(&broken, &mut server, false);
    assert!(shown[step].contains("limit 1"), "seed {seed}: the mismatch is at a limited range: {shown:#?}");
}

#[test]
fn conform_etcd_agrees_with_the_real_server() {
    let _turn = turn();
    if server(&servers::ETCD).is_none() {
        return;
    }
    let o = locksim(&["conform", "etcd", "--seeds", "0..2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("etcd: 2 seeds (seeds 0..2): ") && out.contains(" agreed, 0 mismatched"), "{out}");
}

/// A planted bug: an ephemeral node is created persistent, so it outlives its session.
fn ephemeral_outlives_session(request: &mut ZkRequest) {
    if let ZkRequest::Op { op: ZkOp::Create { mode: mode @ CreateMode::Ephemeral, .. }, .. } = request {
        *mode = CreateMode::Persistent;
    }
}

#[test]
fn an_ephemeral_that_outlives_its_session_is_caught() {
    let _turn = turn();
    let Some(mut server) = server(&servers::ZOOKEEPER) else { return };
    let broken = Zk {
        model: || {
            let model = ZkState::new(Duration::from_millis(TICK_MS));
            Box::new(Planted { model, bend: ephemeral_outlives_session })
        },
    };
    let (seed, shown, step, model, real) = caught(&broken, &mut server, false);
    let before = &shown[..=step];
    assert!(before.iter().any(|s| s.contains("Ephemeral")), "seed {seed}: an ephemeral create came first: {shown:#?}");
    assert_ne!(model, real);
}

#[test]
fn conform_zk_agrees_with_the_real_server() {
    let _turn = turn();
    if server(&servers::ZOOKEEPER).is_none() {
        return;
    }
    let o = locksim(&["conform", "zk", "--seeds", "0..2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("zk: 2 seeds (seeds 0..2): ") && out.contains(" agreed, 0 mismatched"), "{out}");
}

#[test]
fn a_server_given_by_address_must_answer_there() {
    let o = locksim(&["conform", "redis", "--server", "127.0.0.1:1", "--seeds", "0..1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), "locksim: no redis-server answers at 127.0.0.1:1\n");
    let o = locksim(&["conform", "--server", "127.0.0.1:1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("name its family"), "{}", stderr(&o));
}

/// A planted bug: `SELECT … FOR UPDATE` locks nothing, so a second locker never waits.
fn for_update_locks_nothing(request: &mut SqlRequest) {
    if let SqlRequest::Execute { stmt: Stmt::Select { for_update, .. }, .. } = request {
        *for_update = false;
    }
}

#[test]
fn a_select_for_update_that_locks_nothing_is_caught() {
    let _turn = turn();
    let Some(mut server) = server(&servers::POSTGRES) else { return };
    let broken = Sql { model: || Box::new(Planted { model: sql::fresh(), bend: for_update_locks_nothing }) };
    let (seed, shown, step, model, real) = caught(&broken, &mut server, false);
    let before = &shown[..=step];
    assert!(before.iter().any(|s| s.contains("FOR UPDATE")), "seed {seed}: a FOR UPDATE came first: {shown:#?}");
    assert_ne!(model, real);
}

/// A real answer that comes a slot after the model's in both plays is a finding only if it comes late
/// again when its script is played alone (`conform` replays it so: a busy machine is not late alone).
/// A wait the model lacks is such a finding, and stays one.
#[test]
fn a_wait_the_model_lacks_is_late_again_when_played_alone() {
    let _turn = turn();
    let Some(mut server) = server(&servers::POSTGRES) else { return };
    let broken = Sql { model: || Box::new(Planted { model: sql::fresh(), bend: for_update_locks_nothing }) };
    let steps = vec![
        client(100, 0, Stmt::Begin),
        client(200, 0, for_update("k0")),
        client(300, 1, Stmt::Begin),
        // Real PostgreSQL answers it at client-0's commit; the broken model at once.
        client(400, 1, for_update("k0")),
        client(1000, 0, Stmt::Commit),
        client(1100, 1, Stmt::Commit),
    ];
    let late = |outcome: &Outcome<sql::Op>| matches!(outcome, Outcome::Mismatch { step: 3, late: true, .. });
    let first = compare(&broken, &mut server, &steps).unwrap();
    assert!(late(&first), "{first:?}");
    drop(server);
    let again = replay_alone(&broken, &steps).unwrap();
    assert!(late(&again), "{again:?}");
}

fn client(at_ms: u64, client: usize, stmt: Stmt) -> Step<sql::Op> {
    Step { at_ms, action: Action::Client { client, op: sql::Op::Stmt(stmt) } }
}

fn for_update(key: &str) -> Stmt {
    Stmt::Select { table: "locksim_conform".into(), key: key.into(), for_update: true }
}

/// What PostgreSQL 15 does, first seen with psql and here played on it: a row's second waiter's
/// `lock_timeout` starts again when it becomes first in line; an insert does not wait for a row that is
/// only locked; an update whose condition fails on the row it sees does not wait; a crash loses what
/// was not committed and skips the sequence past what it logged ahead.
#[test]
fn waits_timeouts_and_crashes_are_answered_as_postgres_does() {
    let update_if_big = Stmt::Update {
        table: "locksim_conform".into(),
        key: "k0".into(),
        set: vec![("n".into(), Expr::ColumnPlus("n".into(), 1))],
        cond: vec![Cond { column: "n".into(), op: CmpOp::Gt, rhs: Expr::Value(Value::Int(10)) }],
    };
    let insert = Stmt::Insert {
        table: "locksim_conform".into(),
        key: "k0".into(),
        row: vec![("n".into(), Expr::Value(Value::Int(1)))],
    };
    let nextval = || Stmt::NextVal { sequence: "locksim_conform_fence".into() };
    let close = |at_ms, client| Step { at_ms, action: Action::Client { client, op: sql::Op::Close } };
    let steps = vec![
        client(100, 2, Stmt::SetLockTimeout(Duration::from_millis(1450))),
        client(200, 0, Stmt::Begin),
        client(300, 0, for_update("k0")),
        client(400, 1, Stmt::Begin),
        client(500, 1, for_update("k0")),
        client(600, 2, Stmt::Begin),
        client(700, 2, for_update("k0")),
        client(800, 3, insert),
        client(900, 3, update_if_big),
        client(1000, 0, Stmt::Commit),
        // client-1 has the row; client-2 sleeps again, from 1000 ms, for 1450 ms more.
        client(2000, 1, Stmt::Commit),
        client(2100, 3, nextval()),
        client(2200, 3, Stmt::Begin),
        client(2300, 3, Stmt::Insert { table: "locksim_conform".into(), key: "k1".into(), row: vec![] }),
        Step { at_ms: 2400, action: Action::Restart { keep: true } },
        client(4000, 3, nextval()),
        client(4100, 2, for_update("k1")),
        close(4200, 0),
        close(4300, 1),
        close(4400, 2),
        close(4500, 3),
    ];
    let answers = Sql::default().model(&steps);
    let shown: Vec<(&str, u64)> = answers.iter().map(|a| (a.text.as_str(), a.at_ms)).collect();
    let row = "n=3 owner=null until=null";
    assert_eq!(
        shown[..17],
        vec![
            ("ok", 100),
            ("ok", 200),
            (row, 300),
            ("ok", 400),
            (row, 1000),
            ("ok", 600),
            // client-2 waited from 700 ms: had its timeout not started again it would end at 2150 ms.
            (row, 2000),
            ("error unique_violation", 800),
            ("0 rows", 900),
            ("ok", 1000),
            ("ok", 2000),
            ("1", 2100),
            ("ok", 2200),
            ("1 rows", 2300),
            // The sequence logged 1 + 32 ahead; the insert was not committed.
            ("34", 4000),
            ("no rows", 4100),
            ("closed", 4200),
        ]
    );
    let _turn = turn();
    let Some(mut server) = server(&servers::POSTGRES) else { return };
    assert_eq!(compare(&Sql::default(), &mut server, &steps).unwrap(), Outcome::Agree);
}

#[test]
fn conform_sql_agrees_with_the_real_server() {
    let _turn = turn();
    if server(&servers::POSTGRES).is_none() {
        return;
    }
    let o = locksim(&["conform", "sql", "--seeds", "0..2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("sql: 2 seeds (seeds 0..2): ") && out.contains(" agreed, 0 mismatched"), "{out}");
}

/// PostgreSQL, where pgbouncer can be started in front of it too (`None`, said on stderr, where either
/// is not installed and not required).
fn pooled_server() -> Option<Server> {
    let server = server(&servers::POSTGRES)?;
    let (pooler, backend) = Pgbouncer::front().expect("the family has a pooler");
    let upstream = servers::Upstream { port: server.addr().0.port(), backend };
    match Server::start_in_front(pooler, upstream) {
        Ok(_) => Some(server),
        Err(e) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!("skipped: {e:#} (set LOCKSIM_REQUIRE_SERVERS=1 to make this a failure)");
            None
        }
        Err(e) => panic!("{e:#}"),
    }
}

#[test]
fn conform_pgbouncer_agrees_with_a_real_pooler() {
    let _turn = turn();
    if pooled_server().is_none() {
        return;
    }
    let o = locksim(&["conform", "pgbouncer", "--seeds", "0..2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("pgbouncer: 2 seeds (seeds 0..2): ") && out.contains(" agreed, 0 mismatched"), "{out}");
}

/// A planted bug: the model's pooler resets every backend it takes back (`DISCARD ALL`, as
/// `server_reset_query_always = 1` does), so a session advisory lock never outlives its statement —
/// where the real pgbouncer, at its defaults, leaves it on the backend for the next client.
#[test]
fn a_pooler_that_resets_its_backends_is_caught() {
    let _turn = turn();
    let Some(mut server) = pooled_server() else { return };
    let (seed, shown, step, model, real) = caught(&Pgbouncer { planted_reset: true }, &mut server, false);
    let before = &shown[..=step];
    assert!(before.iter().any(|s| s.contains("pg_try_advisory_lock")), "seed {seed}: a lock came first: {shown:#?}");
    assert_ne!(model, real);
}
