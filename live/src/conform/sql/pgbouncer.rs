//! pgbouncer in transaction pooling: the model's pooler (`sim/src/backend/sql/pool.rs`) in front of the
//! model's PostgreSQL, against Debian's pgbouncer 1.18 started in front of the real PostgreSQL for
//! each play, with `pool_mode = transaction` and `default_pool_size = 2`.
//!
//! What decides a verdict behind a pooler is which backend a client's statement runs on and what
//! session state that backend carries, so the scripts are made of statements that answer with it and
//! never wait on a lock: `pg_try_advisory_lock` and `pg_advisory_unlock` (true or false by the backend's
//! session locks), `pg_try_advisory_xact_lock`, `BEGIN` and `COMMIT` (a transaction keeps its backend),
//! a `SELECT`, and closing the connection (inside a transaction, pgbouncer closes the backend). Two or
//! three clients share two backends, so a client may wait for one, first come first served. No restarts
//! or stops: a server restart behind a pooler is another plan's.

use super::{close_all, next_session, Client, Driver, Op, Origin, Session, Sql, ADVISORY, KEYS, TABLE};
use crate::conform::{Action, Answer, Family, ModelOf, Step, SLOT_MS};
use crate::servers::{Addr, Launcher, Server};
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::sql::BACKEND_PARAMS;
use locksim_sim::backend::sql::{PoolMode, Pooler, SqlState, Stmt};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::sync::Arc;

/// `default_pool_size`, on both sides.
const POOL_SIZE: usize = 2;

/// The pooled family, with the pooler it is checked against (a test plants one that resets every
/// backend it takes back, as `server_reset_query_always = 1` would, where the real one runs with 0).
#[derive(Default)]
pub struct Pgbouncer {
    pub planted_reset: bool,
}

/// The model's database, behind its pooler in transaction mode (`reset_always`: resetting every
/// backend it takes back).
fn pooled(reset_always: bool) -> SqlState {
    super::fresh().with_pooler(Pooler { size: POOL_SIZE, reset_always, ..Pooler::new(PoolMode::Transaction) })
}

impl Family for Pgbouncer {
    const NAME: &'static str = "pgbouncer";
    const ABOUT: &'static str =
        "pgbouncer 1.18 (Debian's `pgbouncer`) in transaction pooling in front of PostgreSQL 15: \
                                 which backend a statement gets and the advisory locks it carries.";
    type Op = Op;
    type Conn = Client;
    type Shared = Origin;

    fn server() -> &'static Launcher {
        &crate::servers::POSTGRES
    }

    fn front() -> Option<(&'static Launcher, Params)> {
        let backend = [("pooler", ParamValue::Choice("transaction")), ("pool_size", ParamValue::Int(POOL_SIZE as i64))];
        Some((&crate::servers::PGBOUNCER, Params::resolve(BACKEND_PARAMS, backend)))
    }

    fn script(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        draw(rng)
    }

    fn script_without_faults(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
        draw(rng)
    }

    fn kind(op: &Op) -> &'static str {
        Sql::kind(op)
    }

    fn model(&self, steps: &[Step<Op>]) -> Vec<Answer> {
        let model: fn() -> Box<ModelOf<SqlState>> = match self.planted_reset {
            false => || Box::new(pooled(false)),
            true => || Box::new(pooled(true)),
        };
        Sql { model }.model(steps)
    }

    fn reset(server: &Server) -> anyhow::Result<Origin> {
        Sql::reset(server)
    }

    fn started(origin: &Origin, epoch_ms: i64) {
        Sql::started(origin, epoch_ms)
    }

    fn connect(addr: &Addr, origin: &Arc<Origin>, client: usize) -> anyhow::Result<Client> {
        Sql::connect(addr, origin, client)
    }

    fn send(client: &mut Client, op: &Op) -> anyhow::Result<String> {
        Sql::send(client, op)
    }

    fn reconnect(client: &mut Client) {
        Sql::reconnect(client)
    }

    fn valid(steps: &[Step<Op>]) -> bool {
        rules_kept(steps)
    }
}

/// A script: 2 or 3 clients, 15 to 40 statements a slot or more apart, each from a client whose last
/// statement was answered a slot before; then every connection closed.
fn draw(rng: &mut ChaCha8Rng) -> Vec<Step<Op>> {
    let clients = rng.gen_range(2..=3);
    let mut driver = Driver::new(Box::new(pooled(false)));
    driver.sessions.resize(clients, None);
    driver.ended.resize(clients, None);
    let mut sessions = vec![Session::default(); clients];
    let (mut steps, mut t) = (Vec::new(), 0);
    for _ in 0..rng.gen_range(15..=40) {
        t += SLOT_MS * rng.gen_range(1..=3);
        driver.advance(t);
        let ready: Vec<usize> =
            (0..clients).filter(|c| !driver.waiting(*c) && driver.answered_at(*c) + SLOT_MS <= t).collect();
        let Some(&client) = ready.get(rng.gen_range(0..ready.len().max(1))) else { continue };
        let key = ADVISORY[rng.gen_range(0..ADVISORY.len())];
        let op = match rng.gen_range(0..9) {
            0..=2 => Op::Stmt(Stmt::TryAdvisoryLock(key)),
            3 | 4 => Op::Stmt(Stmt::AdvisoryUnlock(key)),
            5 if sessions[client].in_transaction => Op::Stmt(Stmt::Commit),
            5 => Op::Stmt(Stmt::Begin),
            6 => Op::Stmt(Stmt::TryAdvisoryXactLock(key)),
            7 => Op::Stmt(Stmt::Select { table: TABLE.into(), key: KEYS[0].into(), for_update: false }),
            _ => Op::Close,
        };
        sessions[client] = next_session(sessions[client], &op);
        let step = Step { at_ms: t, action: Action::Client { client, op } };
        driver.step(&step);
        steps.push(step);
    }
    close_all(&mut driver, &mut steps, t);
    steps
}

/// The rules scripts are drawn by, checked on the model: no server faults; a client sends only once
/// answered, a slot after; nothing is left waiting at the end.
fn rules_kept(steps: &[Step<Op>]) -> bool {
    let mut driver = Driver::new(Box::new(pooled(false)));
    for s in steps {
        driver.advance(s.at_ms);
        let Action::Client { client, .. } = &s.action else { return false };
        if driver.sessions.len() > *client
            && (driver.waiting(*client) || driver.answered_at(*client) + SLOT_MS > s.at_ms)
        {
            return false;
        }
        driver.step(s);
    }
    (0..driver.sessions.len()).all(|c| !driver.waiting(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::{coverage, script};
    use std::collections::BTreeMap;

    #[test]
    fn scripts_keep_their_rules_and_show_backends_carrying_locks() {
        let mut counts = BTreeMap::new();
        let mut carried = 0;
        for seed in 0..200 {
            let steps = script::<Pgbouncer>(seed);
            assert!(rules_kept(&steps), "seed {seed}");
            coverage::<Pgbouncer>(&steps, &mut counts);
            // Whether the script's answers show what a backend carries from one client to the next.
            let kept = Pgbouncer::default().model(&steps);
            let reset = Pgbouncer { planted_reset: true }.model(&steps);
            carried += usize::from(kept != reset);
        }
        for kind in
            ["pg_try_advisory_lock", "pg_advisory_unlock", "pg_try_advisory_xact_lock", "BEGIN", "COMMIT", "close"]
        {
            assert!(counts.get(kind).is_some_and(|n| *n > 20), "{kind}: {counts:?}");
        }
        // Most scripts answer differently when the pooler resets its backends: what they carry shows.
        assert!(carried > 100, "{carried} of 200 scripts tell a resetting pooler apart");
    }
}
