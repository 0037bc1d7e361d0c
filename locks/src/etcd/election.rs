//! `etcd.election`: clientv3 `concurrency.Election` — campaign, lead, resign, campaign again.
//!
//! Source: etcd 3.5 `client/v3/concurrency/election.go`, step by step:
//! 1. The client's session: a lease of `ttl`, kept alive (reused; a new one once its keep-alive stops).
//! 2. `Campaign(val)`: Txn If(CreateRevision(prefix/{lease}) = 0) Then(Put(prefix/{lease}, val,
//!    WithLease)) Else(Get(prefix/{lease})). Our revision is the transaction's, or our key's
//!    create_revision (a different value would be proclaimed; ours never differs).
//! 3. `waitDeletes(prefix, rev - 1)` as the mutex does; on timeout, Resign and fail. Unlike the mutex
//!    since 3.5.0, Campaign does not check afterwards that its key still exists.
//! 4. Leader. The fencing token is our key's create_revision.
//! 5. `Resign`: Txn If(CreateRevision(our key) = rev) Then(Delete(our key)).
//!
//! `Observe` (a follower's view of the leader) is [`observe`].
//!
//! Expected (catalog): one wake-up per resignation; a leader paused past its TTL comes back still leading
//! beside the next (`double-holder`), fenced by its revision.

use super::{connect_as, live_session, lost_while_held, wait_deletes, whole_seconds, EtcdApi, Failed, Session};
use super::{ACQUIRE_TIMEOUT, CALL_TIMEOUT, ENDPOINTS, LOST_ON, TTL};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::etcd::{Cmp, Compare, EventType, KeyValue, Op, OpResult, Range, Target};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "etcd.election",
    family: &super::FAMILY,
    summary: "clientv3 concurrency.Election: campaign (queue by create_revision), lead, resign",
    source: "etcd client/v3/concurrency Election (3.5)",
    params: &[TTL, ACQUIRE_TIMEOUT, CALL_TIMEOUT, ENDPOINTS, LOST_ON],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[LEASE_RENEW],
    validate: whole_seconds,
    build,
};

const PREFIX: &str = "/election/";

struct Candidate {
    ctx: Ctx,
    params: Params,
    etcd: super::EtcdConn,
    session: Option<Session>,
    /// Our proposal's value.
    name: String,
    /// Our key and its create_revision while we lead.
    leading: Option<(String, i64)>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let etcd = connect_as(&ctx, servers, params);
    let name = ctx.name();
    Box::new(Candidate { ctx, params: params.clone(), etcd, session: None, name, leading: None })
}

impl Candidate {
    /// Step 2: our key and its revision.
    async fn propose(&self, lease: i64) -> Result<(String, i64), Failed> {
        let key = format!("{PREFIX}{lease:x}");
        let absent = Compare { key: key.clone(), cmp: Cmp::Equal, target: Target::CreateRevision(0) };
        let put = Op::Put { key: key.clone(), value: self.name.clone(), lease };
        let txn = self.etcd.txn(vec![absent], vec![put], vec![Op::Range(Range::key(&key))]).await?;
        let existing = match &txn.results[0] {
            OpResult::Range { kvs, .. } => kvs.first().map(|kv| kv.create_revision),
            _ => None,
        };
        Ok((key, existing.unwrap_or(txn.revision)))
    }

    /// Step 5.
    async fn resign(&self, key: &str, rev: i64) -> Result<(), Failed> {
        let ours = Compare { key: key.into(), cmp: Cmp::Equal, target: Target::CreateRevision(rev) };
        self.etcd.txn(vec![ours], vec![Op::Delete { key: key.into(), prefix: false }], vec![]).await.map(drop)
    }
}

#[async_trait(?Send)]
impl Lock for Candidate {
    async fn acquire(&mut self) -> Outcome<Grant> {
        if let Err(e) = live_session(&mut self.session, &self.etcd, self.params.duration("ttl")).await {
            return e.outcome("session");
        }
        let lease = self.session.as_ref().expect("live").lease;
        let (key, rev) = match self.propose(lease).await {
            Ok(proposal) => proposal,
            Err(e) => return e.outcome("campaign"),
        };
        let waited = tokio::select! {
            biased;
            waited = wait_deletes(&self.etcd, PREFIX, rev - 1) => waited.map_err(|e| e.outcome("wait")),
            () = self.ctx.sleep(self.params.duration("acquire_timeout")) => Err(Outcome::Fail("timed out waiting".into())),
        };
        if let Err(outcome) = waited {
            let _ = self.resign(&key, rev).await;
            return outcome;
        }
        self.leading = Some((key, rev));
        Outcome::Ok(Grant { token: Some(rev as u64) })
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some((key, rev)) = self.leading.take() else { return Outcome::Fail("not the leader".into()) };
        match self.resign(&key, rev).await {
            Ok(()) => Outcome::Ok(()),
            Err(e) => e.outcome("resign"),
        }
    }

    async fn lost(&self) -> String {
        lost_while_held(&self.leading, &self.session, &self.params).await
    }
}

/// `Observe`: each leader's key and value as the leadership changes hands, as a follower sees it — the
/// oldest key under the prefix, then a watch on it until its deletion. Calls `seen` for each leader
/// until a call fails, and returns how.
pub async fn observe(etcd: &impl EtcdApi, mut seen: impl FnMut(KeyValue)) -> Failed {
    loop {
        let (kvs, revision) = match etcd.get(Range::first_created(PREFIX)).await {
            Ok(found) => found,
            Err(e) => return e,
        };
        let (key, from) = match kvs.first() {
            Some(kv) => {
                seen(kv.clone());
                (kv.key.clone(), revision + 1)
            }
            None => {
                // No leader: wait for the first put under the prefix.
                let mut watcher = match etcd.watch(PREFIX, true, revision).await {
                    Ok(w) => w,
                    Err(_) => return Failed::Timeout,
                };
                loop {
                    let Some(response) = watcher.next().await else { return Failed::Timeout };
                    if let Some(put) = response.events.iter().find(|e| e.kind == EventType::Put) {
                        seen(put.kv.clone());
                        break (put.kv.key.clone(), put.kv.mod_revision + 1);
                    }
                }
            }
        };
        let mut watcher = match etcd.watch(&key, false, from).await {
            Ok(w) => w,
            Err(_) => return Failed::Timeout,
        };
        loop {
            let Some(response) = watcher.next().await else { return Failed::Timeout };
            if response.events.iter().any(|e| e.kind == EventType::Delete) {
                break;
            }
        }
    }
}
