//! An etcd lock of our own: a key put only if absent, on a lease kept alive; losers poll.
//!
//! Take: grant a lease (a `concurrency.Session`), then a transaction `if create_revision(key) == 0 then
//! put(key, lease)`; on failure look again every `poll`. The revision of the winning transaction is the
//! fencing token. Release: revoke the lease, which deletes the key. A holder that crashes stops
//! renewing: its lease, and the key with it, expire after the TTL and the next client goes on.
//! `scenarios/etcd-lease-key-crash.toml` checks that it stays safe when holders crash.

use locksim_locks::etcd::{connect, EtcdApi, EtcdConn, Session, CALL_TIMEOUT, FAMILY, TTL};
use locksim_locks::params::{ParamSpec, Params};
use locksim_locks::{async_trait, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::etcd::{Cmp, Compare, Op, Target};
use locksim_sim::ctx::Ctx;
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "my.etcd-lease-key",
    family: &FAMILY,
    summary: "put the key if absent, on a lease kept alive; losers poll",
    source: "a hand-rolled lock (examples/own-locks)",
    params: &[TTL, CALL_TIMEOUT, ParamSpec::duration("poll", 250, "time between tries")],
    offers_token: true,
    offers_shared: false,
    guard: Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: locksim_locks::etcd::whole_seconds,
    build,
};

const KEY: &str = "/my-locks/orders";

struct LeaseKey {
    ctx: Ctx,
    etcd: EtcdConn,
    ttl: Duration,
    poll: Duration,
    held: Option<Session>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let etcd = connect(&ctx, servers, params.duration("call_timeout"));
    let (ttl, poll) = (params.duration("ttl"), params.duration("poll"));
    Box::new(LeaseKey { ctx, etcd, ttl, poll, held: None })
}

#[async_trait(?Send)]
impl Lock for LeaseKey {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let session = match Session::new(&self.etcd, self.ttl).await {
            Ok(session) => session,
            Err(e) => return e.outcome("grant"),
        };
        for _ in 0..120 {
            let absent = Compare { key: KEY.into(), cmp: Cmp::Equal, target: Target::CreateRevision(0) };
            let put = Op::Put { key: KEY.into(), value: format!("{:x}", session.lease), lease: session.lease };
            match self.etcd.txn(vec![absent], vec![put], vec![]).await {
                Ok(txn) if txn.succeeded => {
                    self.held = Some(session);
                    return Outcome::Ok(Grant { token: Some(txn.revision as u64) });
                }
                Ok(_) => self.ctx.sleep(self.poll).await,
                Err(e) => {
                    let _ = self.etcd.revoke(session.lease).await;
                    return e.outcome("txn");
                }
            }
        }
        let _ = self.etcd.revoke(session.lease).await;
        Outcome::Fail("gave up".into())
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some(session) = self.held.take() else { return Outcome::Fail("not held".into()) };
        match self.etcd.revoke(session.lease).await {
            Ok(()) => Outcome::Ok(()),
            Err(e) => Outcome::Unknown(format!("revoke: {e:?}")),
        }
    }
}
