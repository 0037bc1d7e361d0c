//! Request/reply tables against ZooKeeper's documented behaviour.

use super::*;

const C1: NodeIx = NodeIx(1);
const C2: NodeIx = NodeIx(2);

fn zk() -> ZkState {
    ZkState::new(Duration::from_millis(2000))
}

fn connect(zk: &mut ZkState, client: NodeIx, now: i64) -> SessionId {
    match zk
        .apply(
            Now::at(now),
            client,
            ZkRequest::Connect { requested_ms: 6000, session: None, last_zxid: 0 },
            &mut Out::default(),
        )
        .reply
    {
        ZkReply::Connected { session, timeout_ms } => {
            assert_eq!(timeout_ms, 6000);
            session
        }
        other => panic!("{other:?}"),
    }
}

fn op(zk: &mut ZkState, client: NodeIx, session: SessionId, now: i64, op: ZkOp, out: &mut Out) -> ZkReply {
    zk.apply(Now::at(now), client, ZkRequest::Op { session, op }, out).reply
}

fn create(path: &str, mode: CreateMode) -> ZkOp {
    ZkOp::Create { path: path.into(), data: String::new(), mode }
}

#[test]
fn sequential_children_get_increasing_suffixes_and_czxids() {
    let mut z = zk();
    let s = connect(&mut z, C1, 0);
    let mut out = Out::default();
    assert!(matches!(
        op(&mut z, C1, s, 0, create("/locks", CreateMode::Persistent), &mut out),
        ZkReply::Created { .. }
    ));
    let a = op(&mut z, C1, s, 0, create("/locks/lock-", CreateMode::EphemeralSequential), &mut out);
    let b = op(&mut z, C1, s, 0, create("/locks/lock-", CreateMode::EphemeralSequential), &mut out);
    match (a, b) {
        (ZkReply::Created { path: pa, stat: sa }, ZkReply::Created { path: pb, stat: sb }) => {
            assert_eq!((pa.as_str(), pb.as_str()), ("/locks/lock-0000000000", "/locks/lock-0000000001"));
            assert!(sb.czxid > sa.czxid);
            assert_eq!(sa.ephemeral_owner, s);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_delete_notifies_each_watcher_once() {
    let mut z = zk();
    let (s1, s2) = (connect(&mut z, C1, 0), connect(&mut z, C2, 0));
    let mut out = Out::default();
    op(&mut z, C1, s1, 0, create("/lock", CreateMode::Ephemeral), &mut out);
    assert_eq!(
        op(&mut z, C2, s2, 0, create("/lock", CreateMode::Ephemeral), &mut out),
        ZkReply::Error(ZkError::NodeExists)
    );
    assert!(matches!(
        op(&mut z, C2, s2, 0, ZkOp::Exists { path: "/lock".into(), watch: true }, &mut out),
        ZkReply::Exists(Some(_))
    ));
    op(&mut z, C2, s2, 0, ZkOp::Exists { path: "/lock".into(), watch: true }, &mut out);
    assert_eq!(op(&mut z, C1, s1, 1, ZkOp::Delete { path: "/lock".into(), version: -1 }, &mut out), ZkReply::Deleted);
    assert_eq!(out.pushes.len(), 1, "a session's watch on a path fires once, however often it was set");
    assert_eq!(out.events, vec![(C2, EventKind::Notify { cause: "NodeDeleted /lock".into() })]);
    // Used up: a second change notifies nobody.
    op(&mut z, C1, s1, 2, create("/lock", CreateMode::Ephemeral), &mut out);
    assert_eq!(out.pushes.len(), 1);
}

#[test]
fn get_data_on_a_missing_node_fails_and_leaves_no_watch_but_exists_does() {
    let mut z = zk();
    let s = connect(&mut z, C1, 0);
    let mut out = Out::default();
    assert_eq!(
        op(&mut z, C1, s, 0, ZkOp::GetData { path: "/x".into(), watch: true }, &mut out),
        ZkReply::Error(ZkError::NoNode)
    );
    assert_eq!(op(&mut z, C1, s, 0, ZkOp::Exists { path: "/y".into(), watch: true }, &mut out), ZkReply::Exists(None));
    op(&mut z, C1, s, 0, create("/x", CreateMode::Persistent), &mut out);
    op(&mut z, C1, s, 0, create("/y", CreateMode::Persistent), &mut out);
    let causes: Vec<_> = out.events.iter().map(|(_, k)| k.clone()).collect();
    assert_eq!(causes, vec![EventKind::Notify { cause: "NodeCreated /y".into() }]);
}

#[test]
fn an_expired_session_loses_its_ephemerals_and_fires_their_watches() {
    let mut z = zk();
    let (s1, s2) = (connect(&mut z, C1, 0), connect(&mut z, C2, 0));
    let mut out = Out::default();
    op(&mut z, C1, s1, 0, create("/lock", CreateMode::Ephemeral), &mut out);
    op(&mut z, C2, s2, 0, ZkOp::GetData { path: "/lock".into(), watch: true }, &mut out);
    // s2 keeps pinging; s1 goes silent. 6 s timeout from 0 rounds up to the 8 s tick.
    op(&mut z, C2, s2, 4000, ZkOp::Ping, &mut out);
    z.tick(Now::at(6000), &mut out);
    assert!(out.pushes.is_empty());
    z.tick(Now::at(8000), &mut out);
    assert_eq!(out.pushes.len(), 1);
    assert_eq!(
        op(&mut z, C2, s2, 8000, ZkOp::Exists { path: "/lock".into(), watch: false }, &mut out),
        ZkReply::Exists(None)
    );
    assert_eq!(op(&mut z, C1, s1, 8000, ZkOp::Ping, &mut out), ZkReply::Error(ZkError::SessionExpired));
    let reconnect = ZkRequest::Connect { requested_ms: 6000, session: Some(s1), last_zxid: 0 };
    assert_eq!(z.apply(Now::at(8000), C1, reconnect, &mut out).reply, ZkReply::Error(ZkError::SessionExpired));
}

#[test]
fn an_expired_sessions_connection_is_closed_the_one_it_last_attached_on() {
    let mut z = zk();
    let (first, second) = (Connection::on(C1, 1), Connection::on(C1, 2));
    let connect = ZkRequest::Connect { requested_ms: 6000, session: None, last_zxid: 0 };
    let ZkReply::Connected { session, .. } = z.apply_via(Now::at(0), first, connect, &mut Out::default()).reply else {
        panic!("connected")
    };
    let mut out = Out::default();
    let reattach = ZkRequest::Connect { requested_ms: 6000, session: Some(session), last_zxid: 0 };
    assert!(matches!(z.apply_via(Now::at(1000), second, reattach, &mut out).reply, ZkReply::Connected { .. }));
    z.tick(Now::at(6000), &mut out);
    assert!(out.closes.is_empty(), "alive until its bucket");
    // Renewed at 1000: 7000 rounds up to the 8 s tick.
    z.tick(Now::at(8000), &mut out);
    assert_eq!(out.closes, [second], "FinalRequestProcessor closes the session's ServerCnxn");
}

#[test]
fn a_session_expiring_in_the_same_tick_still_hears_of_the_ephemeral_deleted_before_its_own_close() {
    // The tracker expires a bucket's sessions one after the other, each by its own closeSession: the
    // second one's connection is still open while the first one's ephemerals go, and its watch fires.
    let mut z = zk();
    let (s1, s2) = (connect(&mut z, C1, 0), connect(&mut z, C2, 0));
    let mut out = Out::default();
    op(&mut z, C1, s1, 0, create("/lock", CreateMode::Ephemeral), &mut out);
    op(&mut z, C2, s2, 0, ZkOp::Exists { path: "/lock".into(), watch: true }, &mut out);
    let mut out = Out::default();
    z.tick(Now::at(8000), &mut out);
    let pushed: Vec<NodeIx> = out.pushes.iter().map(|(to, _)| *to).collect();
    assert_eq!(pushed, [C2], "NodeDeleted /lock reaches the other expiring session");
    assert_eq!(out.closes.len(), 2, "both connections closed");
}

#[test]
fn closing_a_session_deletes_its_ephemerals_at_once() {
    let mut z = zk();
    let s = connect(&mut z, C1, 0);
    let mut out = Out::default();
    op(&mut z, C1, s, 0, create("/lock", CreateMode::Ephemeral), &mut out);
    assert_eq!(op(&mut z, C1, s, 1, ZkOp::Close, &mut out), ZkReply::Closed);
    let s2 = connect(&mut z, C2, 1);
    assert_eq!(
        op(&mut z, C2, s2, 1, ZkOp::Exists { path: "/lock".into(), watch: false }, &mut out),
        ZkReply::Exists(None)
    );
}

#[test]
fn set_data_checks_the_version_counts_it_up_and_fires_data_watches() {
    let mut z = zk();
    let (s1, s2) = (connect(&mut z, C1, 0), connect(&mut z, C2, 0));
    let mut out = Out::default();
    op(&mut z, C1, s1, 0, create("/leader", CreateMode::Persistent), &mut out);
    op(&mut z, C2, s2, 0, ZkOp::GetData { path: "/leader".into(), watch: true }, &mut out);
    let set = |version| ZkOp::SetData { path: "/leader".into(), data: "client-1".into(), version };
    assert_eq!(op(&mut z, C1, s1, 1, set(3), &mut out), ZkReply::Error(ZkError::BadVersion));
    let ZkReply::DataSet(stat) = op(&mut z, C1, s1, 1, set(0), &mut out) else { panic!("setData failed") };
    assert_eq!(stat.version, 1);
    assert!(stat.mzxid > stat.czxid);
    assert_eq!(out.events, vec![(C2, EventKind::Notify { cause: "NodeDataChanged /leader".into() })]);
    let ZkReply::Data { data, .. } =
        op(&mut z, C2, s2, 2, ZkOp::GetData { path: "/leader".into(), watch: false }, &mut out)
    else {
        panic!("getData failed")
    };
    assert_eq!(data, "client-1");
    assert_eq!(
        op(&mut z, C1, s1, 2, ZkOp::SetData { path: "/none".into(), data: String::new(), version: -1 }, &mut out),
        ZkReply::Error(ZkError::NoNode)
    );
}

#[test]
fn a_clock_jump_does_not_expire_sessions() {
    let mut z = ZkState::new(Duration::from_secs(2));
    let mut out = Out::default();
    let s1 = connect(&mut z, C1, 0);
    z.tick(Now { wall_ms: 600_000, mono_ms: 2000 }, &mut out);
    assert!(matches!(op(&mut z, C1, s1, 2000, ZkOp::Ping, &mut out), ZkReply::Pong), "the tracker times by nanoTime");
}

#[test]
fn closing_a_session_deletes_all_its_ephemerals_in_one_transaction() {
    let mut z = zk();
    let mut out = Out::default();
    let s1 = connect(&mut z, C1, 0);
    let s2 = connect(&mut z, C2, 0);
    op(&mut z, C1, s1, 0, create("/a", CreateMode::Ephemeral), &mut out);
    op(&mut z, C1, s1, 0, create("/b", CreateMode::Ephemeral), &mut out);
    op(&mut z, C1, s1, 0, ZkOp::Close, &mut out);
    let ZkReply::Created { stat, .. } = op(&mut z, C2, s2, 0, create("/c", CreateMode::Persistent), &mut out) else {
        panic!()
    };
    // /a and /b were zxids 1 and 2; the closeSession that deleted both was 3.
    assert_eq!(stat.czxid, 4);
}

#[test]
fn removed_watches_do_not_fire_and_removing_none_is_no_watcher() {
    let mut z = zk();
    let mut out = Out::default();
    let s1 = connect(&mut z, C1, 0);
    op(&mut z, C1, s1, 0, create("/l", CreateMode::Persistent), &mut out);
    op(&mut z, C1, s1, 0, ZkOp::GetChildren { path: "/l".into(), watch: true }, &mut out);
    assert_eq!(op(&mut z, C1, s1, 0, ZkOp::RemoveWatches { path: "/l".into() }, &mut out), ZkReply::WatchesRemoved);
    op(&mut z, C1, s1, 0, create("/l/a", CreateMode::Persistent), &mut out);
    assert!(out.pushes.is_empty(), "no notification for a removed watch");
    assert_eq!(
        op(&mut z, C1, s1, 0, ZkOp::RemoveWatches { path: "/l".into() }, &mut out),
        ZkReply::Error(ZkError::NoWatcher)
    );
}

#[test]
fn a_multi_applies_every_write_in_one_zxid_or_none_and_fires_no_watch_when_it_fails() {
    let mut z = zk();
    let (s1, s2) = (connect(&mut z, C1, 0), connect(&mut z, C2, 0));
    let mut out = Out::default();
    op(&mut z, C1, s1, 0, create("/l", CreateMode::Persistent), &mut out);
    op(&mut z, C2, s2, 0, ZkOp::Exists { path: "/l/a".into(), watch: true }, &mut out);
    let txn = |ops| ZkOp::Multi(ops);
    let make = |path: &str| TxnOp::Create { path: path.into(), data: String::new(), mode: CreateMode::Ephemeral };
    // The second create fails: nothing is applied, and the watch on /l/a does not fire.
    let mut failed = Out::default();
    let reply = op(&mut z, C1, s1, 0, txn(vec![make("/l/a"), make("/missing/b")]), &mut failed);
    assert_eq!(reply, ZkReply::Multi(Err((1, ZkError::NoNode))));
    assert!(failed.pushes.is_empty() && failed.events.is_empty(), "no watch fired");
    assert_eq!(
        op(&mut z, C1, s1, 0, ZkOp::Exists { path: "/l/a".into(), watch: false }, &mut out),
        ZkReply::Exists(None)
    );
    // Each operation sees the ones before it; all share one zxid; a check guards the lot.
    let check = TxnOp::Check { path: "/l".into(), version: 0 };
    let set = TxnOp::SetData { path: "/l/a".into(), data: "x".into(), version: 0 };
    let mut fired = Out::default();
    match op(&mut z, C1, s1, 0, txn(vec![check, make("/l/a"), set]), &mut fired) {
        ZkReply::Multi(Ok(replies)) => match &replies[..] {
            [ZkReply::Checked, ZkReply::CreatedPath { path }, ZkReply::DataSet(set)] => {
                assert_eq!(path, "/l/a");
                assert_eq!(set.czxid, set.mzxid, "one transaction, one zxid");
                assert_eq!(set.version, 1);
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    assert_eq!(fired.pushes.len(), 1, "the watch on /l/a fired once");
    // A failed check leaves everything as it was; the error names the operation.
    let stale = TxnOp::Check { path: "/l/a".into(), version: 1 };
    let set = TxnOp::SetData { path: "/l/a".into(), data: "y".into(), version: -1 };
    let reply = op(&mut z, C1, s1, 0, txn(vec![set, stale]), &mut out);
    assert_eq!(reply, ZkReply::Multi(Err((1, ZkError::BadVersion))), "the check sees the set before it");
    let data = op(&mut z, C1, s1, 0, ZkOp::GetData { path: "/l/a".into(), watch: false }, &mut out);
    assert!(matches!(data, ZkReply::Data { data, stat } if data == "x" && stat.version == 1), "and the set is undone");
    // The ephemeral a multi made belongs to the session: it goes when the session is closed.
    op(&mut z, C1, s1, 0, ZkOp::Close, &mut out);
    assert_eq!(
        op(&mut z, C2, s2, 0, ZkOp::Exists { path: "/l/a".into(), watch: false }, &mut out),
        ZkReply::Exists(None)
    );
    assert_eq!(
        op(&mut z, C2, s2, 0, ZkOp::Sync { path: "/l".into() }, &mut out),
        ZkReply::Synced { path: "/l".into() }
    );
}
