//! Request/reply tables against etcd's documented behaviour.

use super::*;

const C1: NodeIx = NodeIx(1);
const C2: NodeIx = NodeIx(2);

fn put(key: &str, value: &str, lease: LeaseId) -> Op {
    Op::Put { key: key.into(), value: value.into(), lease }
}

fn cmp(key: &str, cmp: Cmp, target: Target) -> Compare {
    Compare { key: key.into(), cmp, target }
}

fn apply(e: &mut EtcdState, now: i64, from: NodeIx, request: EtcdRequest, out: &mut Out) -> EtcdReply {
    e.apply(Now::at(now), from, request, out)
}

fn at(e: &mut EtcdState, request: EtcdRequest) -> EtcdReply {
    e.apply(Now::at(0), C1, request, &mut Out::default())
}

fn revision(reply: &EtcdReply) -> i64 {
    match reply {
        EtcdReply::Op { revision, .. } | EtcdReply::Txn { revision, .. } => *revision,
        other => panic!("{other:?}"),
    }
}

fn get(e: &mut EtcdState, key: &str) -> Option<KeyValue> {
    match at(e, EtcdRequest::Op(Op::Range(Range::key(key)))) {
        EtcdReply::Op { result: OpResult::Range { mut kvs, .. }, .. } => kvs.pop(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn each_write_advances_the_revision_by_one_and_keys_keep_their_create_revision() {
    let mut e = EtcdState::default();
    assert_eq!(revision(&at(&mut e, EtcdRequest::Op(Op::Range(Range::key("a"))))), 1, "etcd starts at revision 1");
    assert_eq!(revision(&at(&mut e, EtcdRequest::Op(put("a", "1", 0)))), 2);
    assert_eq!(revision(&at(&mut e, EtcdRequest::Op(put("a", "2", 0)))), 3);
    let a = get(&mut e, "a").unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version, a.value.as_str()), (2, 3, 2, "2"));
    // A transaction of several writes is one revision; one that changes nothing is none.
    let txn = EtcdRequest::Txn { compare: vec![], success: vec![put("b", "", 0), put("c", "", 0)], failure: vec![] };
    assert_eq!(revision(&at(&mut e, txn)), 4);
    assert_eq!(revision(&at(&mut e, EtcdRequest::Op(Op::Delete { key: "zzz".into(), prefix: false }))), 4);
    assert_eq!(revision(&at(&mut e, EtcdRequest::Op(Op::Delete { key: "a".into(), prefix: false }))), 5);
    at(&mut e, EtcdRequest::Op(put("a", "3", 0)));
    let a = get(&mut e, "a").unwrap();
    assert_eq!((a.create_revision, a.version), (6, 1), "a recreated key starts over");
}

#[test]
fn txn_compares_follow_etcd() {
    use Cmp::*;
    use Target::*;
    let mut e = EtcdState::default();
    at(&mut e, EtcdRequest::Op(put("k", "v", 0))); // create_revision = mod_revision = 2, version 1
    let cases: &[(Compare, bool)] = &[
        (cmp("missing", Equal, CreateRevision(0)), true),
        (cmp("missing", Equal, Version(0)), true),
        (cmp("missing", Equal, ModRevision(0)), true),
        (cmp("missing", Equal, Value(String::new())), false),
        (cmp("missing", NotEqual, Value("x".into())), false),
        (cmp("k", Equal, CreateRevision(0)), false),
        (cmp("k", Equal, CreateRevision(2)), true),
        (cmp("k", Greater, ModRevision(1)), true),
        (cmp("k", Less, Version(2)), true),
        (cmp("k", Equal, Value("v".into())), true),
        (cmp("k", NotEqual, Value("v".into())), false),
        (cmp("k", Greater, Value("u".into())), true),
    ];
    for (compare, holds) in cases {
        let txn = EtcdRequest::Txn {
            compare: vec![compare.clone()],
            success: vec![Op::Range(Range::key("k"))],
            failure: vec![Op::Range(Range::key("missing"))],
        };
        match at(&mut e, txn) {
            EtcdReply::Txn { succeeded, results, revision } => {
                assert_eq!(succeeded, *holds, "{compare:?}");
                let count = usize::from(*holds);
                assert!(
                    matches!(&results[0], OpResult::Range { count: c, .. } if *c == count),
                    "{compare:?}: the other branch ran"
                );
                assert_eq!(revision, 2, "reads do not advance the revision");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_failed_compare_runs_the_else_branch_and_every_compare_must_hold() {
    let mut e = EtcdState::default();
    let lock = |e: &mut EtcdState, who: &str| {
        at(
            e,
            EtcdRequest::Txn {
                compare: vec![
                    cmp("lock", Cmp::Equal, Target::CreateRevision(0)),
                    cmp("x", Cmp::Equal, Target::Version(0)),
                ],
                success: vec![put("lock", who, 0)],
                failure: vec![Op::Range(Range::key("lock"))],
            },
        )
    };
    assert!(matches!(lock(&mut e, "a"), EtcdReply::Txn { succeeded: true, revision: 2, .. }));
    match lock(&mut e, "b") {
        EtcdReply::Txn { succeeded: false, results, revision: 2 } => {
            assert!(matches!(&results[0], OpResult::Range { kvs, .. } if kvs[0].value == "a"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ranges_sort_limit_and_bound_by_create_revision() {
    let mut e = EtcdState::default();
    for key in ["m/c", "m/a", "m/b", "n/x"] {
        at(&mut e, EtcdRequest::Op(put(key, "", 0))); // m/c@2, m/a@3, m/b@4
    }
    let keys = |e: &mut EtcdState, r: Range| match at(e, EtcdRequest::Op(Op::Range(r))) {
        EtcdReply::Op { result: OpResult::Range { kvs, count }, .. } => {
            (kvs.into_iter().map(|kv| kv.key).collect::<Vec<_>>(), count)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(keys(&mut e, Range { prefix: true, ..Range::key("m/") }).0, ["m/a", "m/b", "m/c"]);
    assert_eq!(keys(&mut e, Range::first_created("m/")), (vec!["m/c".to_string()], 3));
    assert_eq!(keys(&mut e, Range::last_created_by("m/", 3)).0, ["m/a"]);
    assert_eq!(keys(&mut e, Range::last_created_by("m/", 1)).0, Vec::<String>::new());
    // The count is of every key in the range: etcd prunes by create revision after counting.
    assert_eq!(keys(&mut e, Range::last_created_by("m/", 1)).1, 3);
    assert_eq!(keys(&mut e, Range::last_created_by("m/", 2)), (vec!["m/c".to_string()], 3));
}

#[test]
fn leases_expire_by_the_server_clock_and_take_their_keys() {
    let mut e = EtcdState::default();
    let mut out = Out::default();
    let EtcdReply::LeaseGranted { id, ttl_s } = apply(&mut e, 0, C1, EtcdRequest::LeaseGrant { ttl_s: 1 }, &mut out)
    else {
        panic!()
    };
    assert_eq!(ttl_s, 2, "etcd's minimum TTL");
    assert_eq!(at(&mut e, EtcdRequest::Op(put("gone", "", 99))), EtcdReply::Error(EtcdError::LeaseNotFound));
    at(&mut e, EtcdRequest::Op(put("lock", "", id)));
    assert_eq!(
        apply(&mut e, 1500, C1, EtcdRequest::LeaseKeepAlive { id }, &mut out),
        EtcdReply::KeepAlive { id, ttl_s: 2 }
    );
    e.tick(Now::at(3000), &mut out);
    assert!(get(&mut e, "lock").is_some(), "renewed at 1.5 s: expires at 3.5 s");
    assert_eq!(
        apply(&mut e, 3000, C1, EtcdRequest::LeaseTimeToLive { id }, &mut out),
        EtcdReply::TimeToLive { id, ttl_s: 0, granted_ttl_s: 2 }
    );
    e.tick(Now::at(3500), &mut out);
    assert!(get(&mut e, "lock").is_none(), "the expired lease deleted its key");
    assert_eq!(
        apply(&mut e, 3500, C1, EtcdRequest::LeaseKeepAlive { id }, &mut out),
        EtcdReply::KeepAlive { id, ttl_s: 0 }
    );
    assert!(out
        .events
        .iter()
        .any(|(n, k)| *n == C1 && matches!(k, EventKind::Session { state } if state.contains("expired"))));
}

#[test]
fn an_expired_lease_is_not_renewed_before_the_revoke_runs() {
    let mut e = EtcdState::default();
    let mut out = Out::default();
    let EtcdReply::LeaseGranted { id, .. } = apply(&mut e, 0, C1, EtcdRequest::LeaseGrant { ttl_s: 2 }, &mut out)
    else {
        panic!()
    };
    at(&mut e, EtcdRequest::Op(put("lock", "", id)));
    // Expired at 2 s; the periodic revoke has not run yet when the keep-alive arrives.
    assert_eq!(
        apply(&mut e, 2100, C1, EtcdRequest::LeaseKeepAlive { id }, &mut out),
        EtcdReply::KeepAlive { id, ttl_s: 0 }
    );
    e.tick(Now::at(2500), &mut out);
    assert!(get(&mut e, "lock").is_none(), "the lease was not revived");
}

#[test]
fn a_clock_jump_does_not_expire_leases() {
    let mut e = EtcdState::default();
    let mut out = Out::default();
    let EtcdReply::LeaseGranted { id, .. } = apply(&mut e, 0, C1, EtcdRequest::LeaseGrant { ttl_s: 5 }, &mut out)
    else {
        panic!()
    };
    at(&mut e, EtcdRequest::Op(put("lock", "", id)));
    e.tick(Now { wall_ms: 60_000, mono_ms: 1000 }, &mut out);
    assert!(
        get(&mut e, "lock").is_some(),
        "a +59 s wall jump changes nothing: the lessor times by the monotonic clock"
    );
}

#[test]
fn watches_see_changes_in_revision_order_and_replay_the_past() {
    let mut e = EtcdState::default();
    let mut out = Out::default();
    at(&mut e, EtcdRequest::Op(put("lock", "a", 0))); // revision 2
    let watch =
        |id, start| EtcdRequest::Watch { id, connection: 7, key: "lock".into(), prefix: false, start_revision: start };
    assert_eq!(apply(&mut e, 0, C2, watch(1, 0), &mut out), EtcdReply::WatchCreated { id: 1, revision: 2 });
    assert!(out.pushes.is_empty(), "from the next change on");
    at(&mut e, EtcdRequest::Op(Op::Delete { key: "lock".into(), prefix: false })); // revision 3
                                                                                   // A second watch from revision 2 replays the put and the delete.
    apply(&mut e, 0, C2, watch(2, 2), &mut out);
    let seen: Vec<(WatchId, Vec<(EventType, i64)>)> = out
        .pushes
        .drain(..)
        .map(|(_, m)| {
            let r = m.downcast::<WatchResponse>().unwrap();
            (r.watch_id, r.events.iter().map(|ev| (ev.kind, ev.kv.mod_revision)).collect())
        })
        .collect();
    assert_eq!(seen, vec![(2, vec![(EventType::Put, 2), (EventType::Delete, 3)])]);
    let mut out = Out::default();
    let mut e2 = e;
    apply(&mut e2, 0, C1, EtcdRequest::Op(put("lock", "b", 0)), &mut out);
    let notified: Vec<_> = out.events.iter().map(|(n, k)| (n.0, k.clone())).collect();
    assert_eq!(
        notified,
        vec![
            (2, EventKind::Notify { cause: "PUT lock@4".into() }),
            (2, EventKind::Notify { cause: "PUT lock@4".into() })
        ],
        "both watches of client 2 hear of it"
    );
    apply(&mut e2, 0, C2, EtcdRequest::CancelWatch { id: 1 }, &mut out);
    // A new connection from the same node (it restarted) drops the old one's watchers.
    apply(
        &mut e2,
        0,
        C2,
        EtcdRequest::Watch { id: 1, connection: 8, key: "other".into(), prefix: false, start_revision: 0 },
        &mut out,
    );
    let mut out = Out::default();
    apply(&mut e2, 0, C1, EtcdRequest::Op(put("lock", "c", 0)), &mut out);
    assert!(out.events.is_empty(), "no watcher of `lock` is left");
}

#[test]
fn revoking_a_lease_deletes_its_keys_in_one_revision() {
    let mut e = EtcdState::default();
    let EtcdReply::LeaseGranted { id, .. } = at(&mut e, EtcdRequest::LeaseGrant { ttl_s: 10 }) else { panic!() };
    at(&mut e, EtcdRequest::Op(put("a", "", id)));
    at(&mut e, EtcdRequest::Op(put("b", "", id))); // revision 3
    assert_eq!(at(&mut e, EtcdRequest::LeaseRevoke { id }), EtcdReply::LeaseRevoked { revision: 4 });
    assert!(get(&mut e, "a").is_none() && get(&mut e, "b").is_none());
    assert_eq!(at(&mut e, EtcdRequest::LeaseRevoke { id }), EtcdReply::Error(EtcdError::LeaseNotFound));
}

#[test]
fn a_restarted_server_gives_every_lease_its_ttl_plus_the_election_timeout() {
    let mut e = EtcdState::default();
    let EtcdReply::LeaseGranted { id, .. } = at(&mut e, EtcdRequest::LeaseGrant { ttl_s: 2 }) else { panic!() };
    e.recover(1500);
    // Due at 1500 + 1000 (Promote's extension) + 2000 = 4500 ms: alive before, revoked by that tick.
    let mut out = Out::default();
    e.tick(Now::at(4000), &mut out);
    let ttl = |e: &mut EtcdState, now, out: &mut Out| apply(e, now, C1, EtcdRequest::LeaseTimeToLive { id }, out);
    assert_eq!(ttl(&mut e, 4400, &mut out), EtcdReply::TimeToLive { id, ttl_s: 0, granted_ttl_s: 2 });
    e.tick(Now::at(4500), &mut out);
    assert_eq!(ttl(&mut e, 4600, &mut out), EtcdReply::TimeToLive { id, ttl_s: -1, granted_ttl_s: 0 });
}

#[test]
fn a_watch_from_a_future_revision_hears_nothing_before_it() {
    let mut e = EtcdState::default();
    let mut out = Out::default();
    let watch = EtcdRequest::Watch { id: 1, connection: 7, key: "k".into(), prefix: false, start_revision: 4 };
    apply(&mut e, 0, C2, watch, &mut out);
    apply(&mut e, 0, C1, EtcdRequest::Op(put("k", "a", 0)), &mut out); // revision 2
    apply(&mut e, 0, C1, EtcdRequest::Op(put("k", "b", 0)), &mut out); // revision 3
    assert!(out.pushes.is_empty(), "revisions 2 and 3 come before its start");
    apply(&mut e, 0, C1, EtcdRequest::Op(put("k", "c", 0)), &mut out); // revision 4
    let revisions: Vec<i64> = out
        .pushes
        .drain(..)
        .flat_map(|(_, m)| m.downcast::<WatchResponse>().unwrap().events.into_iter().map(|ev| ev.kv.mod_revision))
        .collect();
    assert_eq!(revisions, [4], "from its start revision on");
}
