//! `zk.semaphore-mutex`: Curator's InterProcessSemaphoreMutex — a semaphore of one lease, not reentrant.
//!
//! Source: Curator `InterProcessSemaphoreV2.internalAcquire1Lease` with maxLeases = 1.
//! 1. Take the semaphore's internal InterProcessMutex (`/semaphore/locks`, as `zk.sequential`).
//! 2. Create a protected EPHEMERAL_SEQUENTIAL lease under `/semaphore/leases`.
//! 3. `getChildren(leases)` with a watch: if our lease is missing, fail; if there is at most one lease
//!    (ours), we have it; otherwise wait for the children to change and look again.
//! 4. Whatever happened, remove the watchers this attempt set (`removeWatchers` in `finally`: a lease
//!    granted at once leaves a child watch on the leases behind, which would otherwise wake us at every
//!    later change) and release the internal mutex. The fencing token is the lease's czxid.
//! 5. Release: delete our lease (guaranteed delete). Not reentrant: a holder that asks again waits for its
//!    own lease like anyone else, until its timeout.
//!
//! Curator documents the semaphore as fair: leases are granted in request order (the mutex's queue).
//! Expected (catalog): like every ZooKeeper lock, a holder paused past its session timeout loses its lease
//! while it still believes it holds the lock.

use super::sequential::{Driver, Held, Queue, Sequential, QUEUE_CREATE};
use super::{lost, words, ZkApi, ACQUIRE_TIMEOUT, LOST_ON, SESSION_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::ZkClient;
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "zk.semaphore-mutex",
    family: &super::FAMILY,
    summary: "Curator InterProcessSemaphoreMutex: one lease, taken under an internal mutex; not reentrant",
    source: "Apache Curator InterProcessSemaphoreV2 / InterProcessSemaphoreMutex",
    params: &[SESSION_TIMEOUT, ACQUIRE_TIMEOUT, LOST_ON],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[QUEUE_CREATE, LEASE_RENEW],
    validate: super::positive_session,
    build,
};

const LEASES: &str = "/semaphore/leases";
/// The semaphore's internal mutex.
const LOCKS: Queue = Queue { dir: "/semaphore/locks", name: "lock-", driver: Driver::Exclusive };

struct SemaphoreMutex {
    /// The mechanism of the internal mutex, whose session the leases share.
    core: Sequential,
    /// The internal mutex while we hold it.
    mutex: Option<Held>,
    /// Our lease and its session.
    held: Option<(String, ZkClient)>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(SemaphoreMutex { core: Sequential::new(params, ctx, servers, true), mutex: None, held: None })
}

impl SemaphoreMutex {
    /// Steps 2–3, under the internal mutex: our lease's path and czxid once it is the only one. A lease
    /// that was not granted is deleted again, as Curator closes it.
    async fn take_lease(&mut self, zk: &ZkClient) -> Result<(String, u64), Outcome<Grant>> {
        let (lease, stat, zk) = self.core.create_in(zk, LEASES, "lease-").await?;
        let czxid = stat.czxid;
        let zk = &zk;
        match self.wait_for_lease(zk, &lease).await {
            Ok(()) => Ok((lease, czxid)),
            Err(outcome) => {
                self.core.delete(zk, &lease).await;
                Err(outcome)
            }
        }
    }

    async fn wait_for_lease(&self, zk: &ZkClient, lease: &str) -> Result<(), Outcome<Grant>> {
        let name = &lease[LEASES.len() + 1..];
        let ctx: &Ctx = &self.core.ctx;
        let deadline = ctx.now_ms() + self.core.params.duration("acquire_timeout").as_millis() as i64;
        loop {
            let (children, watch) = zk.get_children_watch(LEASES).await.map_err(|e| Outcome::Fail(words(e)))?;
            if !children.iter().any(|c| c == name) {
                return Err(Outcome::Fail("our lease is gone".into()));
            }
            if children.len() <= 1 {
                return Ok(());
            }
            let left = Duration::from_millis((deadline - ctx.now_ms()).max(0) as u64);
            tokio::select! {
                biased;
                _ = watch.fired() => {}
                _ = ctx.sleep(left) => return Err(Outcome::Fail("timed out waiting for a lease".into())),
            }
        }
    }
}

#[async_trait(?Send)]
impl Lock for SemaphoreMutex {
    async fn acquire(&mut self) -> Outcome<Grant> {
        match self.core.acquire(&mut self.mutex, LOCKS).await {
            Outcome::Ok(_) => {}
            other => return other,
        }
        let Some(zk) = self.core.session.live().await else { return Outcome::Fail("cannot reach ZooKeeper".into()) };
        let taken = self.take_lease(&zk).await;
        let _ = zk.remove_watches(LEASES).await;
        let _ = self.core.release(&mut self.mutex).await;
        match taken {
            Ok((lease, czxid)) => {
                self.held = Some((lease, zk));
                Outcome::Ok(Grant { token: Some(czxid) })
            }
            Err(outcome) => outcome,
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        match self.held.take() {
            None => Outcome::Fail("not held by this client".into()),
            Some((lease, zk)) => self.core.delete(&zk, &lease).await,
        }
    }

    async fn lost(&self) -> String {
        match &self.held {
            Some((_, zk)) => lost(zk, self.core.params.choice("lost_on"), &self.core.ctx).await,
            None => std::future::pending().await,
        }
    }
}
