//! Every shipped scenario runs at pinned seeds with its expected verdict asserted.

mod common;

use common::{assert_as_expected, catalog_dir};
use locksim_scenarios::checkers::FindingKind;

/// Each catalog file and the seeds its expectation is asserted on.
const PINNED: &[(&str, u64)] = &[
    ("redis-del-gc-pause", 100),
    ("redis-cad-gc-pause", 100),
    ("redis-cad-fencing-gc-pause", 100),
    ("redis-set-nx-crash", 50),
    ("redis-set-nx-px-crash", 100),
    ("redis-set-nx-drop-reply", 50),
    ("redis-nemesis-del", 200),
    ("redis-cad-fencing-partitions", 200),
    ("redis-getset-clock-jump", 50),
    ("redis-getset-no-faults", 100),
    ("redis-failover", 200),
    ("redis-watchdog-long-pause", 100),
    ("redis-watchdog-long-hold", 100),
    ("redis-redlock-no-faults", 100),
    ("redis-redlock-clock-jump", 100),
    ("redis-redlock-restart", 100),
    ("redis-redlock-restart-persist", 100),
    ("redis-redlock-unchecked-pause", 200),
    ("redis-redlock-checked-pause", 200),
    ("zk-ephemeral-herd", 20),
    ("zk-ephemeral-unfair", 20),
    ("zk-sequential-herd", 50),
    ("zk-ephemeral-gc-pause", 50),
    ("zk-sequential-gc-pause", 50),
    ("zk-sequential-gc-pause-fencing", 50),
    ("zk-sequential-crash-waiter", 100),
    ("zk-sequential-unprotected-drop-reply", 200),
    ("zk-sequential-drop-reply", 200),
    ("zk-sequential-partition-lost-on-lost", 100),
    ("zk-sequential-partition-lost-on-suspended", 100),
    ("zk-sequential-server-restart", 100),
    ("zk-sequential-nemesis", 200),
    ("zk-semaphore-mutex-gc-pause", 50),
    ("zk-semaphore-mutex-herd", 50),
    ("zk-semaphore-mutex-nemesis", 200),
    ("zk-rwlock-readers-share", 50),
    ("zk-rwlock-gc-pause", 50),
    ("zk-rwlock-gc-pause-fencing", 50),
    ("zk-rwlock-nemesis", 200),
    ("zk-leader-election-herd", 50),
    ("zk-leader-election-gc-pause", 50),
    ("zk-leader-election-gc-pause-fencing", 50),
    ("zk-leader-election-partition-watch", 50),
    ("zk-leader-election-nemesis", 1000),
    ("etcd-txn-lease-gc-pause", 50),
    ("etcd-txn-lease-gc-pause-fencing", 50),
    ("etcd-txn-lease-partition", 50),
    ("etcd-txn-lease-partition-keepalive", 50),
    ("etcd-txn-lease-herd", 20),
    ("etcd-txn-lease-wait-herd", 20),
    ("etcd-mutex-herd", 20),
    ("etcd-mutex-nemesis", 200),
    ("etcd-mutex-crash", 50),
    ("etcd-mutex-gc-pause-fencing", 50),
    ("etcd-mutex-waiter-pause-3.4.3", 20),
    ("etcd-mutex-waiter-pause", 10),
    ("etcd-election-gc-pause", 50),
    ("etcd-election-waiter-pause", 20),
    ("etcd-election-herd", 20),
    ("flash-sale-etcd-election", 20),
    ("flash-sale-etcd-mutex", 20),
    ("flash-sale-etcd-txn-lease-wait", 20),
    ("flash-sale-etcd-txn-lease", 20),
    ("flash-sale-none", 20),
    ("flash-sale-redis-getset-expiry", 20),
    ("flash-sale-redis-redlock", 20),
    ("flash-sale-redis-set-nx-px-gc-pause-fencing", 20),
    ("flash-sale-redis-set-nx-px-gc-pause", 20),
    ("flash-sale-redis-set-nx-px", 20),
    ("flash-sale-redis-set-nx", 20),
    ("flash-sale-redis-watchdog", 20),
    ("flash-sale-sql-advisory", 20),
    ("flash-sale-sql-conditional-update-nemesis", 200),
    ("flash-sale-sql-conditional-update", 20),
    ("flash-sale-sql-for-update", 20),
    ("flash-sale-sql-unique-insert-expiry", 20),
    ("flash-sale-sql-unique-insert", 20),
    ("flash-sale-zk-ephemeral", 20),
    ("flash-sale-zk-leader-election", 20),
    ("flash-sale-zk-rwlock", 20),
    ("flash-sale-zk-semaphore-mutex", 20),
    ("flash-sale-zk-sequential-unprotected", 20),
    ("flash-sale-zk-sequential", 20),
    ("sql-advisory-crash", 30),
    ("sql-for-update-crash-default-keepalive", 30),
    ("sql-for-update-crash", 30),
    ("sql-for-update-gc-pause", 30),
    ("sql-for-update-idle-timeout-gc-pause", 30),
    ("sql-for-update-nemesis", 200),
    ("sql-unique-insert-crash", 30),
    ("sql-unique-insert-expiry-client-clock", 30),
    ("sql-unique-insert-expiry-crash", 30),
    ("sql-unique-insert-expiry-gc-pause", 30),
];

#[test]
fn every_catalog_scenario_is_pinned_here() {
    let mut files: Vec<String> = std::fs::read_dir(catalog_dir())
        .unwrap()
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut pinned: Vec<String> = PINNED.iter().map(|(f, _)| f.to_string()).collect();
    pinned.sort();
    assert_eq!(files, pinned, "add new catalog files to PINNED with the seeds their verdict holds on");
}

#[test]
fn every_catalog_scenario_meets_its_expectation() {
    for (stem, seeds) in PINNED {
        assert_as_expected(stem, 0..*seeds);
    }
}

#[test]
fn del_under_a_long_pause_is_caught_as_two_holders_and_a_stale_write() {
    let r = assert_as_expected("redis-del-gc-pause", 0..50);
    assert!(r.unsafe_seeds > 25, "most seeds pause a holder past its TTL; got {}", r.unsafe_seeds);
}

#[test]
fn fencing_turns_the_stale_write_into_a_refusal() {
    let r = assert_as_expected("redis-cad-fencing-gc-pause", 0..50);
    let seen = |k| r.results.iter().any(|s| s.counts.contains_key(&k));
    assert!(seen(FindingKind::DoubleHolder), "fencing does not stop two clients believing they hold the lock");
    assert!(seen(FindingKind::StaleWriteRejected));
    assert!(!seen(FindingKind::UnsafeWrite));
}

#[test]
fn a_ttl_frees_the_lock_of_a_crashed_holder_after_about_the_ttl() {
    let r = assert_as_expected("redis-set-nx-px-crash", 0..50);
    let recoveries: Vec<f64> = r.results.iter().flat_map(|s| s.measurements.recovery_ms.clone()).collect();
    assert!(recoveries.len() > 25, "most seeds crash a holder");
    // TTL 5 s, counted from the holder's SET; the next poll comes within `retry` (100 ms) after expiry.
    for ms in recoveries {
        assert!((3_000.0..5_500.0).contains(&ms), "recovery of {ms} ms is not about the 5 s TTL");
    }
}

#[test]
fn redlock_without_faults_is_safe_over_1000_seeds() {
    assert_as_expected("redis-redlock-no-faults", 0..1000);
}

#[test]
fn compare_and_delete_with_fencing_never_lets_a_stale_write_through_over_1000_seeds() {
    let r = assert_as_expected("redis-cad-fencing-partitions", 0..1000);
    assert!(r.results.iter().all(|s| !s.counts.contains_key(&FindingKind::UnsafeWrite)));
}
