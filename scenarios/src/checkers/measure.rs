//! Measurements every run reports (not findings): acquisitions, latency, messages, recovery time.

use super::holds::kills;
use locksim_sim::history::{EventKind, History, NodeIx};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    pub acquisitions: u64,
    /// Calls to acquire, granted or not: a recipe that fails fast when the lock is taken has few
    /// acquisitions per attempt, and its latency counts only the lucky ones (0 in results from before).
    #[serde(default)]
    pub attempts: u64,
    /// From `AcquireInvoke` to `AcquireOk`, simulated milliseconds.
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_max: f64,
    /// Every message sent in the run (requests, replies, replication).
    pub messages: u64,
    /// Calls that heard no reply within their timeout (none in a run without faults).
    #[serde(default)]
    pub call_timeouts: u64,
    pub messages_per_acquisition: f64,
    /// For each crash of a holder: simulated milliseconds until another client was granted the lock.
    pub recovery_ms: Vec<f64>,
    /// Crashes of a holder after which nobody got the lock before the run ended.
    pub unrecovered: u64,
    /// Clients woken per change that woke anyone (a release, an expiry): the herd curve's points.
    pub notifications_per_release_max: u64,
    /// Every notification sent in the run.
    #[serde(default)]
    pub notifications: u64,
    /// Simulated milliseconds from the first request for the lock to the last release: the time the
    /// run's acquisitions took (a flash sale stops early, once sold out).
    #[serde(default)]
    pub busy_ms: f64,
    pub notifications_per_release_mean: f64,
}

pub fn measure(h: &History, messages: u64, call_timeouts: u64) -> Measurements {
    let mut invoked: BTreeMap<NodeIx, u64> = BTreeMap::new();
    let mut latencies = Vec::new();
    let mut holding: BTreeSet<NodeIx> = BTreeSet::new();
    let mut crashed_holders: Vec<(NodeIx, u64)> = Vec::new();
    let mut recovery_ms = Vec::new();
    let (mut first_ask, mut last_release, mut attempts) = (None, 0, 0);
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireInvoke => {
                invoked.insert(e.node, e.t);
                attempts += 1;
                first_ask = first_ask.or(Some(e.t));
            }
            EventKind::ReleaseOk => last_release = e.t,
            EventKind::AcquireOk { .. } => {
                latencies.extend(invoked.remove(&e.node).map(|t| e.t - t));
                holding.insert(e.node);
                let (recovered, waiting): (Vec<_>, Vec<_>) = crashed_holders.iter().partition(|(c, _)| *c != e.node);
                recovery_ms.extend(recovered.iter().map(|(_, t)| ms(e.t - t)));
                crashed_holders = waiting;
            }
            EventKind::ReleaseInvoke | EventKind::LockLost { .. } => {
                holding.remove(&e.node);
            }
            k if kills(k) => {
                for client in h.residents(e.node).into_iter().filter(|c| holding.remove(c)) {
                    crashed_holders.push((client, e.t));
                }
            }
            _ => {}
        }
    }
    latencies.sort_unstable();
    let acquisitions = latencies.len() as u64;
    let woken: Vec<u64> = super::herd::wakeups(h).values().map(|w| w.len() as u64).collect();
    Measurements {
        acquisitions,
        attempts,
        latency_ms_p50: percentile(&latencies, 50),
        latency_ms_p99: percentile(&latencies, 99),
        latency_ms_max: latencies.last().map_or(0.0, |l| ms(*l)),
        messages,
        call_timeouts,
        messages_per_acquisition: if acquisitions == 0 { 0.0 } else { round3(messages as f64 / acquisitions as f64) },
        recovery_ms,
        unrecovered: crashed_holders.len() as u64,
        notifications_per_release_max: woken.iter().copied().max().unwrap_or(0),
        notifications: woken.iter().sum(),
        busy_ms: first_ask.map_or(0.0, |first| ms(last_release.saturating_sub(first))),
        notifications_per_release_mean: if woken.is_empty() {
            0.0
        } else {
            round3(woken.iter().sum::<u64>() as f64 / woken.len() as f64)
        },
    }
}

/// Nearest-rank percentile of sorted nanoseconds, in milliseconds.
fn percentile(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    ms(sorted[rank - 1])
}

fn ms(ns: u64) -> f64 {
    round3(ns as f64 / 1e6)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::super::test_history::{crash, history, ok};
    use super::*;
    use locksim_sim::history::EventKind::*;

    #[test]
    fn latency_messages_and_recovery_after_a_holder_crash() {
        let crash = crash("client-0");
        let h = history(
            60.0,
            vec![
                (1.0, 0, AcquireInvoke),
                (1.010, 0, ok(1)),
                (2.0, 1, AcquireInvoke),
                (3.0, 0, crash),
                (13.5, 1, ok(2)),
            ],
        );
        let m = measure(&h, 40, 0);
        assert_eq!(m.acquisitions, 2);
        assert_eq!(m.latency_ms_p50, 10.0);
        assert_eq!(m.latency_ms_max, 11_500.0);
        assert_eq!(m.messages_per_acquisition, 20.0);
        assert_eq!(m.recovery_ms, vec![10_500.0]);
        assert_eq!(m.unrecovered, 0);
    }

    #[test]
    fn a_crash_of_a_client_is_a_crash_of_the_worker_holding_on_it() {
        // client-0/w1 (node 4) holds; client-0 crashes: a crashed holder, recovered at client-1's grant.
        let mut h = history(60.0, vec![(1.0, 4, ok(1)), (2.0, 0, crash("client-0")), (5.0, 1, ok(2))]);
        h.nodes.push("client-0/w1".into());
        assert_eq!(measure(&h, 0, 0).recovery_ms, vec![3_000.0]);
        h.nodes[4] = "client-9".into();
        assert!(measure(&h, 0, 0).recovery_ms.is_empty(), "no worker of client-0 held");
    }

    #[test]
    fn a_crash_of_a_client_that_did_not_hold_is_not_a_recovery() {
        let crash = crash("client-1");
        let h = history(60.0, vec![(1.0, 0, ok(1)), (2.0, 1, crash), (3.0, 0, ReleaseInvoke), (4.0, 2, ok(2))]);
        assert!(measure(&h, 0, 0).recovery_ms.is_empty());
    }

    #[test]
    fn a_failed_acquire_is_an_attempt_but_not_an_acquisition() {
        let failed = AcquireFail { reason: "taken".into() };
        let h =
            history(60.0, vec![(1.0, 0, AcquireInvoke), (1.1, 0, ok(1)), (2.0, 1, AcquireInvoke), (2.1, 1, failed)]);
        let m = measure(&h, 0, 0);
        assert_eq!((m.acquisitions, m.attempts), (1, 2));
    }
}
