//! A three-server ensemble in a world, driven by a client speaking the wire requests.

use super::*;
use crate::backend::member::testing::{self, Client, Log, Ran};
use crate::backend::zk::CreateMode;
use crate::fault::{Action, Fault, Target};
use crate::history::EventKind;
use std::time::Duration;

const TIMING: Timing = Timing { tick_ms: 2000, init_limit: 10, sync_limit: 5, apply_lag_ms: 0 };

/// Three servers and a client node running `client` for `secs` under `faults`.
fn run(seed: u64, secs: u64, faults: Vec<Fault>, client: Client) -> Ran<ZkMember> {
    testing::run(seed, secs, faults, |world| deploy(world, 3, TIMING), client, Log::default())
}

fn leaders(states: &[Arc<Mutex<ZkMember>>]) -> Vec<usize> {
    (0..states.len()).filter(|i| states[*i].lock().unwrap().leads()).collect()
}

/// A new session on `to`, of timeout `requested_ms`.
async fn open_session(rpc: &crate::net::Rpc, to: NodeIx, requested_ms: i64) -> SessionId {
    let connect = ZkRequest::Connect { requested_ms, session: None, last_zxid: 0 };
    match rpc.call::<ZkRequest, Stamped>(to, connect, Duration::from_secs(4)).await {
        Ok(Stamped { reply: ZkReply::Connected { session, .. }, .. }) => session,
        other => panic!("no session on {to:?}: {other:?}"),
    }
}

/// Follower `zk-0` cut off from the leader `zk-2` (the highest id wins the first election) from 3 s,
/// for `secs`.
fn follower_cut(secs: u64) -> Fault {
    Fault {
        at: Duration::from_secs(3),
        target: Target::Node("zk-0".into()),
        action: Action::Partition { peers: vec!["zk-2".into()], duration: Some(Duration::from_secs(secs)) },
        on: None,
    }
}

/// Call `to` and note its answer in `log`.
async fn note(log: &Log, rpc: &crate::net::Rpc, to: NodeIx, req: ZkRequest) {
    let answer = call(rpc, to, req).await;
    log.lock().unwrap().push(answer);
}

async fn call(rpc: &crate::net::Rpc, to: NodeIx, req: ZkRequest) -> String {
    match rpc.call::<ZkRequest, Stamped>(to, req, Duration::from_secs(4)).await {
        Ok(stamped) => format!("{:?}", stamped.reply),
        Err(e) => format!("{e:?}"),
    }
}

#[test]
fn the_highest_server_is_elected_and_every_server_serves() {
    let (states, log, _) = run(1, 3, vec![], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            for m in members {
                let r = call(&rpc, m, ZkRequest::Connect { requested_ms: 6000, session: None, last_zxid: 0 }).await;
                log.lock().unwrap().push(r);
            }
        })
    });
    assert_eq!(leaders(&states), vec![2], "every server starts at zxid 0: the highest id wins");
    assert_eq!(log.len(), 3);
    assert!(log.iter().all(|r| r.starts_with("Connected")), "{log:?}");
}

#[test]
fn a_write_through_a_follower_is_seen_on_every_server() {
    let (_, log, _) = run(2, 4, vec![], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            let session = open_session(&rpc, members[0], 6000).await;
            let create = ZkOp::Create { path: "/lock".into(), data: String::new(), mode: CreateMode::Ephemeral };
            note(&log, &rpc, members[0], ZkRequest::Op { session, op: create }).await;
            let exists = ZkOp::Exists { path: "/lock".into(), watch: false };
            let sync = ZkOp::Sync { path: "/lock".into() };
            // Another server, after a sync: the write is there (re-attached there first).
            let reattach = ZkRequest::Connect { requested_ms: 6000, session: Some(session), last_zxid: 0 };
            note(&log, &rpc, members[1], reattach).await;
            note(&log, &rpc, members[1], ZkRequest::Op { session, op: sync }).await;
            note(&log, &rpc, members[1], ZkRequest::Op { session, op: exists }).await;
        })
    });
    assert!(log[0].starts_with("Created"), "{log:?}");
    assert!(log[1].starts_with("Connected"), "{log:?}");
    assert!(log[2].starts_with("Synced"), "{log:?}");
    assert!(log[3].starts_with("Exists(Some"), "{log:?}");
}

/// The follower-cut window, from the source: a holder on a follower cut off from the leader keeps its
/// pings answered while the leader expires its session and deletes its ephemeral; only once the
/// follower gives up on its leader (`syncLimit·tickTime` = 10 s) is the client's connection closed.
#[test]
fn a_follower_cut_from_its_leader_answers_pings_of_a_session_the_leader_expired() {
    let (states, log, events) = run(3, 20, vec![follower_cut(20)], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            let session = open_session(&rpc, members[0], 4000).await;
            let create = ZkOp::Create { path: "/lock".into(), data: String::new(), mode: CreateMode::Ephemeral };
            call(&rpc, members[0], ZkRequest::Op { session, op: create }).await;
            let reader = open_session(&rpc, members[2], 40_000).await;
            // Ping the follower each second, as a holder's client does; note when it stops answering.
            for s in 3..18 {
                env.clock.sleep(Duration::from_secs(1)).await;
                let ping = call(&rpc, members[0], ZkRequest::Op { session, op: ZkOp::Ping }).await;
                let seen = ZkOp::Exists { path: "/lock".into(), watch: false };
                let on_leader = rpc
                    .call::<ZkRequest, Stamped>(
                        members[2],
                        ZkRequest::Op { session: reader, op: seen },
                        Duration::from_secs(1),
                    )
                    .await
                    .map(|stamped| stamped.reply);
                log.lock().unwrap().push(format!("{s} {ping} {on_leader:?}"));
            }
        })
    });
    assert_eq!(leaders(&states), vec![2]);
    let expired =
        events.iter().any(|(_, e)| matches!(e, EventKind::Session { state } if state == "expired by the server"));
    assert!(expired, "the leader expired the session: {events:?}");
    let answered: Vec<&String> = log.iter().filter(|l| l.contains(" Pong ")).collect();
    let deleted_while_answered = answered.iter().any(|l| l.contains("Exists(None)"));
    assert!(deleted_while_answered, "the follower answered pings after the leader deleted the node: {log:#?}");
    assert!(log.iter().any(|l| !l.contains(" Pong ")), "and stopped, once it gave up on its leader: {log:#?}");
}

/// After the heal the follower that gave up finds its leader again (a quorum answers its vote and the
/// leader says it leads), syncs from its snapshot and serves: what the leader deleted meanwhile is gone
/// there too.
#[test]
fn a_follower_cut_off_rejoins_its_leader_after_the_heal() {
    let (states, log, _) = run(4, 25, vec![follower_cut(12)], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            let session = open_session(&rpc, members[0], 4000).await;
            let create = ZkOp::Create { path: "/lock".into(), data: String::new(), mode: CreateMode::Ephemeral };
            note(&log, &rpc, members[0], ZkRequest::Op { session, op: create }).await;
            // Silent through the cut: the leader expires the session. Then a new connection (the
            // follower closed the old one as it gave up on its leader).
            env.clock.sleep(Duration::from_secs(20)).await;
            let socket = Some(rpc.open(members[0]));
            let connect = ZkRequest::Connect { requested_ms: 4000, session: None, last_zxid: 0 };
            let Ok((Stamped { reply: ZkReply::Connected { session, .. }, .. }, _)) =
                rpc.call_on::<ZkRequest, Stamped>(members[0], socket, None, connect, Duration::from_secs(2)).await
            else {
                return log.lock().unwrap().push("the follower does not serve again".into());
            };
            let exists = ZkOp::Exists { path: "/lock".into(), watch: false };
            let answer = rpc
                .call_on::<ZkRequest, Stamped>(
                    members[0],
                    socket,
                    None,
                    ZkRequest::Op { session, op: exists },
                    Duration::from_secs(2),
                )
                .await;
            log.lock().unwrap().push(format!("{:?}", answer.map(|(stamped, _)| stamped.reply)));
        })
    });
    assert_eq!(leaders(&states), vec![2], "the leader kept its quorum (zk-1) throughout");
    assert!(states.iter().all(|s| s.lock().unwrap().serving()), "every server serves after the heal");
    assert_eq!(log.last().map(String::as_str), Some("Ok(Exists(None))"), "{log:?}");
}

/// A sync on the leader with no proposal in flight is answered at once; a read behind it follows.
#[test]
fn a_sync_on_an_idle_leader_is_answered() {
    let (_, log, _) = run(5, 4, vec![], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            let session = open_session(&rpc, members[2], 6000).await;
            note(&log, &rpc, members[2], ZkRequest::Op { session, op: ZkOp::Sync { path: "/".into() } }).await;
            note(&log, &rpc, members[2], ZkRequest::Op { session, op: ZkOp::Ping }).await;
        })
    });
    assert_eq!(log, vec!["Synced { path: \"/\" }".to_string(), "Pong".to_string()]);
}

#[test]
fn a_write_its_server_sends_on_after_the_session_moved_is_refused_and_its_connection_closed() {
    // zk-0 is paused from 3 s to 5 s with the client's create unread; meanwhile the client moves its
    // session to zk-1. When zk-0 resumes it sends the create on, the leader refuses it (the session
    // moved), and zk-0 closes the connection it came on instead of answering.
    let pause = Fault {
        at: Duration::from_secs(3),
        target: Target::Node("zk-0".into()),
        action: Action::Pause { duration: Duration::from_secs(2) },
        on: None,
    };
    let (_, log, _) = run(3, 8, vec![pause], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            let session = open_session(&rpc, members[0], 6000).await;
            env.clock.sleep(Duration::from_millis(1500)).await;
            let create = ZkOp::Create { path: "/lock".into(), data: String::new(), mode: CreateMode::Ephemeral };
            let late = {
                let (rpc, log, zk0) = (rpc.clone(), log.clone(), members[0]);
                madsim::task::spawn_local(
                    async move { note(&log, &rpc, zk0, ZkRequest::Op { session, op: create }).await },
                )
            };
            env.clock.sleep(Duration::from_millis(500)).await;
            note(
                &log,
                &rpc,
                members[1],
                ZkRequest::Connect { requested_ms: 6000, session: Some(session), last_zxid: 0 },
            )
            .await;
            late.await.unwrap();
            let exists = ZkOp::Exists { path: "/lock".into(), watch: false };
            note(&log, &rpc, members[1], ZkRequest::Op { session, op: exists }).await;
        })
    });
    assert!(log[0].starts_with("Connected"), "the session moved to zk-1: {log:?}");
    assert_eq!(log[1], "Reset", "the late create is refused, its connection closed: {log:?}");
    assert_eq!(log[2], "Exists(None)", "and applied nowhere: {log:?}");
}

/// A follower that lags (`lag`: 3 s) answers reads from its copy as it stands — a write the leader
/// committed is not there yet — and answers its own client's write, and a sync, only once it has
/// applied what came before them.
#[test]
fn a_lagging_follower_reads_behind_and_answers_writes_and_syncs_late() {
    let lag = Fault {
        at: Duration::from_millis(2500),
        target: Target::Node("zk-0".into()),
        action: Action::Lag { latency: Duration::from_secs(3), duration: None },
        on: None,
    };
    let (_, log, _) = run(4, 20, vec![lag], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(2)).await;
            let writer = open_session(&rpc, members[2], 6000).await;
            let reader = open_session(&rpc, members[0], 6000).await;
            env.clock.sleep(Duration::from_secs(1)).await;
            let create =
                |path: &str| ZkOp::Create { path: path.into(), data: String::new(), mode: CreateMode::Persistent };
            let exists = || ZkOp::Exists { path: "/lock".into(), watch: false };
            note(&log, &rpc, members[2], ZkRequest::Op { session: writer, op: create("/lock") }).await;
            note(&log, &rpc, members[0], ZkRequest::Op { session: reader, op: exists() }).await;
            let start = env.clock.monotonic_ms();
            let sync = ZkOp::Sync { path: "/lock".into() };
            note(&log, &rpc, members[0], ZkRequest::Op { session: reader, op: sync }).await;
            note(&log, &rpc, members[0], ZkRequest::Op { session: reader, op: exists() }).await;
            let synced_after = env.clock.monotonic_ms() - start;
            let start = env.clock.monotonic_ms();
            note(&log, &rpc, members[0], ZkRequest::Op { session: reader, op: create("/own") }).await;
            let created_after = env.clock.monotonic_ms() - start;
            log.lock().unwrap().push(format!("{synced_after} {created_after}"));
        })
    });
    assert!(log[0].starts_with("Created"), "{log:?}");
    assert_eq!(log[1], "Exists(None)", "the follower has not applied the create: {log:?}");
    assert!(log[2].starts_with("Synced"), "{log:?}");
    assert!(log[3].starts_with("Exists(Some"), "after the sync it has: {log:?}");
    assert!(log[4].starts_with("Created"), "{log:?}");
    let times: Vec<i64> = log[5].split(' ').map(|t| t.parse().unwrap()).collect();
    assert!((3000..3500).contains(&times[0]), "the sync's answer waits for the lag: {log:?}");
    assert!((3000..3500).contains(&times[1]), "and so does the client's own write: {log:?}");
}

/// A client that has seen a zxid is refused by a server that has not applied it yet (`lastZxidSeen`):
/// the connection is closed unanswered. Once the server has caught up, the same connect is accepted.
#[test]
fn a_server_behind_what_the_client_saw_refuses_its_connect_until_it_catches_up() {
    let lag = Fault {
        at: Duration::from_millis(2500),
        target: Target::Node("zk-0".into()),
        action: Action::Lag { latency: Duration::from_secs(3), duration: None },
        on: None,
    };
    let (_, log, _) = run(5, 12, vec![lag], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(3)).await;
            let session = open_session(&rpc, members[2], 6000).await;
            let create = ZkOp::Create { path: "/x".into(), data: String::new(), mode: CreateMode::Persistent };
            let created = rpc.call::<ZkRequest, Stamped>(
                members[2],
                ZkRequest::Op { session, op: create },
                Duration::from_secs(4),
            );
            let Ok(Stamped { zxid, .. }) = created.await else { panic!("created") };
            // Each attempt on a connection of its own, as a client's.
            let reattach = |last_zxid| {
                let connect = ZkRequest::Connect { requested_ms: 6000, session: Some(session), last_zxid };
                let socket = Some(rpc.open(members[0]));
                rpc.call_on::<ZkRequest, Stamped>(members[0], socket, None, connect, Duration::from_secs(2))
            };
            let show = |answer: Result<(Stamped, u32), _>| {
                answer
                    .map(|(s, _)| s.reply)
                    .map_or_else(|e: crate::net::CallError| format!("{e:?}"), |reply| format!("{reply:?}"))
            };
            let refused = show(reattach(zxid).await);
            // Without the zxid (a client that saw nothing), the same server takes it at once.
            let taken = show(reattach(0).await);
            env.clock.sleep(Duration::from_millis(3500)).await;
            let caught_up = show(reattach(zxid).await);
            log.lock().unwrap().extend([refused, taken, caught_up]);
        })
    });
    assert!(!log[0].starts_with("Connected"), "zk-0 has not applied the create: refused: {log:?}");
    assert!(log[1].starts_with("Connected"), "{log:?}");
    assert!(log[2].starts_with("Connected"), "it has now: {log:?}");
}
