//! A three-member cluster in a world, driven by a client speaking the requests to chosen members.

use super::*;
use crate::backend::etcd::Range;
use crate::backend::member::testing::{self, Client, Log, Ran};
use crate::fault::{Action, Fault, Target};
use crate::history::EventKind;
use std::time::Duration;

/// Three members and a client node running `client` for `secs` under `faults`, with `log` as the
/// client's log.
fn run_with_log(seed: u64, secs: u64, faults: Vec<Fault>, client: Client, log: Log) -> Ran<EtcdMember> {
    testing::run(seed, secs, faults, |world| deploy(world, 3, Version::V3_5_13), client, log)
}

fn run(seed: u64, secs: u64, faults: Vec<Fault>, client: Client) -> Ran<EtcdMember> {
    run_with_log(seed, secs, faults, client, Log::default())
}

fn leaders(states: &[Arc<Mutex<EtcdMember>>]) -> Vec<usize> {
    (0..states.len()).filter(|i| states[*i].lock().unwrap().leads()).collect()
}

fn leader_of(states: &[Arc<Mutex<EtcdMember>>]) -> usize {
    let leaders = leaders(states);
    assert_eq!(leaders.len(), 1, "one leader: {leaders:?}");
    leaders[0]
}

async fn call(rpc: &crate::net::Rpc, to: NodeIx, req: EtcdRequest) -> String {
    match rpc.call::<EtcdRequest, EtcdReply>(to, req, Duration::from_secs(3)).await {
        Ok(reply) => format!("{reply:?}"),
        Err(e) => format!("{e:?}"),
    }
}

async fn note(log: &Log, rpc: &crate::net::Rpc, to: NodeIx, req: EtcdRequest) {
    let answer = call(rpc, to, req).await;
    log.lock().unwrap().push(answer);
}

fn put(key: &str, lease: LeaseId) -> EtcdRequest {
    EtcdRequest::Op(Op::Put { key: key.into(), value: "v".into(), lease })
}

fn get(key: &str) -> EtcdRequest {
    EtcdRequest::Op(Op::Range(Range::key(key)))
}

fn crash(member: usize, at_ms: u64, down_ms: u64) -> Fault {
    Fault {
        at: Duration::from_millis(at_ms),
        target: Target::Node(format!("etcd-{member}")),
        action: Action::Crash { restart_after: Some(Duration::from_millis(down_ms)), host: false },
        on: None,
    }
}

#[test]
fn one_leader_is_elected_and_a_write_through_any_member_is_read_on_every_other() {
    let (states, log, _) = run(1, 6, vec![], |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(3)).await;
            note(&log, &rpc, members[0], put("k", 0)).await;
            for m in &members {
                note(&log, &rpc, *m, get("k")).await;
            }
        })
    });
    leader_of(&states);
    assert!(log[0].starts_with("Op { revision: 2"), "{log:?}");
    for read in &log[1..] {
        assert!(read.contains("key: \"k\""), "a linearizable read sees the write everywhere: {log:?}");
    }
    let terms: BTreeSet<u64> = states.iter().map(|s| s.lock().unwrap().term()).collect();
    assert_eq!(terms.len(), 1, "one term: {terms:?}");
}

/// The holder's lease outlives its keep-alives by its TTL — and by more each time a new leader
/// promotes its lessor (etcd#9395): with elections every 2 s and a TTL of 4 s, it never expires; once
/// the leader stays, it expires a TTL and an election timeout after the last promotion.
#[test]
fn a_lease_nobody_keeps_alive_expires_on_the_leader_unless_new_leaders_keep_promoting_it() {
    let client: Client = |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(3)).await;
            let granted = call(&rpc, members[0], EtcdRequest::LeaseGrant { ttl_s: 4 }).await;
            log.lock().unwrap().push(granted);
            note(&log, &rpc, members[0], put("lock", 1)).await;
            for _ in 0..30 {
                env.clock.sleep(Duration::from_secs(1)).await;
                let at_s = crate::clock::sim_now_ns() / 1_000_000_000;
                let mut answer = String::new();
                for m in &members {
                    answer = call(&rpc, *m, get("lock")).await;
                    if answer.starts_with("Op") {
                        break;
                    }
                }
                log.lock().unwrap().push(format!("{at_s} {answer}"));
            }
        })
    };
    // The second of the first look that found the key gone.
    let gone_at = |log: &[String]| {
        let gone = log[2..].iter().find(|r| r.contains("kvs: []"))?;
        gone.split(' ').next()?.parse::<u64>().ok()
    };
    // Steady: the lease is gone about its TTL after the grant at 3 s.
    let (_, log, events) = run(2, 36, vec![], client);
    assert!(log[0].starts_with("LeaseGranted { id: 1"), "{log:?}");
    let steady = gone_at(&log).expect("expired");
    assert!((7..=9).contains(&steady), "gone at {steady} s: {log:?}");
    let expired = events
        .iter()
        .filter(|(_, e)| matches!(e, EventKind::Session { state } if state.contains("expired by the server")));
    assert_eq!(expired.count(), 1, "recorded once, by the leader");
    // Elections every 2 s for 16 s from 4 s (the leader of the moment killed each time), then none.
    let mut kills = Vec::new();
    for k in 0..8 {
        let at_ms = 4_000 + 2_000 * k;
        let (states, _, _) = run(2, at_ms / 1000, kills.clone(), client);
        kills.push(crash(leader_of(&states), at_ms, 1_500));
    }
    let (_, log, _) = run(2, 36, kills, client);
    let churned = gone_at(&log).expect("expired once the elections stop");
    assert!(churned >= 22, "kept while leaders changed: gone at {churned} s: {log:?}");
}

/// A member cut off from the other two: it has no leader, so a read on it waits (and times out) rather
/// than answer stale, and a write is dropped at once; after the heal it catches up.
#[test]
fn a_member_cut_off_from_the_quorum_answers_nothing_until_the_heal() {
    let (states, _, _) = run(3, 3, vec![], |_, _, _| Box::pin(async {}));
    let leader = leader_of(&states);
    let cut_off = (leader + 1) % 3;
    let others: Vec<String> = (0..3).filter(|m| *m != cut_off).map(|m| format!("etcd-{m}")).collect();
    let cut = Fault {
        at: Duration::from_secs(4),
        target: Target::Node(format!("etcd-{cut_off}")),
        action: Action::Partition { peers: others, duration: Some(Duration::from_secs(8)) },
        on: None,
    };
    let client: Client = |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(6)).await;
            // Which member is cut off is the test's: it writes it down first.
            let cut_off: usize = log.lock().unwrap()[0].parse().unwrap();
            let other = members[(cut_off + 1) % 3];
            note(&log, &rpc, other, put("k", 0)).await;
            note(&log, &rpc, members[cut_off], get("k")).await;
            note(&log, &rpc, members[cut_off], put("k", 0)).await;
            env.clock.sleep(Duration::from_secs(8)).await;
            note(&log, &rpc, members[cut_off], get("k")).await;
        })
    };
    let (states, log, _) = run_with_log(3, 20, vec![cut], client, Arc::new(Mutex::new(vec![cut_off.to_string()])));
    assert!(log[1].starts_with("Op { revision: 2"), "the quorum writes: {log:?}");
    assert_eq!(log[2], "Timeout", "the cut-off member has no leader to confirm a read: {log:?}");
    assert_eq!(log[3], "Error(ProposalDropped)", "a member with no leader drops a write at once: {log:?}");
    assert!(log[4].contains("key: \"k\""), "after the heal it has caught up: {log:?}");
    assert_eq!(leader_of(&states), leader, "the member that was cut off did not depose the leader (pre-vote)");
}

#[test]
fn the_same_seed_elects_the_same_leader_at_the_same_term() {
    let terms = |seed| {
        let (states, _, _) =
            run(seed, 10, vec![crash(0, 3000, 500), crash(1, 5000, 500)], |_, _, _| Box::pin(async {}));
        let at_end = |s: &Arc<Mutex<EtcdMember>>| {
            let m = s.lock().unwrap();
            (m.term(), m.leads())
        };
        states.iter().map(at_end).collect::<Vec<_>>()
    };
    assert_eq!(terms(7), terms(7));
}

/// etcd#15247: a stalled leader answers keep-alives from its own lessor before 3.5.13, while the new
/// leader expires the lease; from 3.5.13 it confirms its leadership first, and cannot.
#[test]
fn a_stalled_leader_renews_leases_until_3_5_13() {
    let renewals = |version: Version| {
        let (states, _, _) = run(4, 3, vec![], |_, _, _| Box::pin(async {}));
        let leader = leader_of(&states);
        let log: Log = Arc::new(Mutex::new(vec![leader.to_string()]));
        let client: Client = |env, members, log| {
            Box::pin(async move {
                let rpc = env.rpc();
                env.clock.sleep(Duration::from_secs(3)).await;
                let leader: usize = log.lock().unwrap()[0].parse().unwrap();
                let granted = call(&rpc, members[leader], EtcdRequest::LeaseGrant { ttl_s: 3 }).await;
                log.lock().unwrap().push(granted);
                // Every second a keep-alive to the (old) leader; then a look at the lease elsewhere.
                for _ in 0..10 {
                    env.clock.sleep(Duration::from_secs(1)).await;
                    note(&log, &rpc, members[leader], EtcdRequest::LeaseKeepAlive { id: 1 }).await;
                }
                let other = members[(leader + 1) % 3];
                note(&log, &rpc, other, EtcdRequest::LeaseTimeToLive { id: 1 }).await;
            })
        };
        let stall = Fault {
            at: Duration::from_millis(3500),
            target: Target::Node(format!("etcd-{leader}")),
            action: Action::Stall { duration: None },
            on: None,
        };
        let deploy = |world: &mut World| deploy(world, 3, version);
        let (_, log, _) = testing::run(4, 60, vec![stall], deploy, client, log);
        let renewed = log.iter().filter(|r| r.starts_with("KeepAlive") && !r.contains("ttl_s: 0")).count();
        let gone = log.iter().any(|r| r.contains("ttl_s: -1"));
        (renewed, gone, log)
    };
    let (renewed, gone, log) = renewals(Version::V3_5_12);
    assert_eq!(renewed, 10, "the stalled leader renews every keep-alive: {log:?}");
    assert!(gone, "while the new leader expires the lease: {log:?}");
    let (renewed, gone, log) = renewals(Version::V3_5_13);
    assert_eq!(renewed, 0, "the stalled leader answers no keep-alive: {log:?}");
    assert!(gone, "{log:?}");
}

/// A lagging member (`lag`: 3 s) answers a linearizable read only once it has applied the leader's
/// commit index: late, never stale.
#[test]
fn a_lagging_member_answers_reads_late_and_never_stale() {
    let (states, _, _) = run(5, 3, vec![], |_, _, _| Box::pin(async {}));
    let laggard = (leader_of(&states) + 1) % 3;
    let log: Log = Arc::new(Mutex::new(vec![laggard.to_string()]));
    let client: Client = |env, members, log| {
        Box::pin(async move {
            let rpc = env.rpc();
            env.clock.sleep(Duration::from_secs(3)).await;
            let laggard: usize = log.lock().unwrap()[0].parse().unwrap();
            let other = members[(laggard + 1) % 3];
            note(&log, &rpc, other, put("k", 0)).await;
            let start = env.clock.monotonic_ms();
            note(&log, &rpc, members[laggard], get("k")).await;
            log.lock().unwrap().push((env.clock.monotonic_ms() - start).to_string());
        })
    };
    let lag = Fault {
        at: Duration::from_millis(2500),
        target: Target::Node(format!("etcd-{laggard}")),
        action: Action::Lag { latency: Duration::from_secs(2), duration: None },
        on: None,
    };
    let (_, log, _) = run_with_log(5, 10, vec![lag], client, log);
    assert!(log[1].starts_with("Op { revision: 2"), "{log:?}");
    assert!(log[2].contains("key: \"k\""), "the read waits for the write: {log:?}");
    let waited: i64 = log[3].parse().unwrap();
    assert!((2000..2500).contains(&waited), "for the lag: {log:?}");
}

/// Member 0 of three driven by hand: elected by member 1's vote, its first entry and a put of `k`
/// committed with member 1.
fn leader_by_hand(version: Version) -> (EtcdMember, MOut) {
    let (l, f1) = (NodeIx(0), NodeIx(1));
    let mut m = EtcdMember::new(0, vec![l, f1, NodeIx(2)], version);
    m.rng = Some(stream(1, Stream::EtcdRaft, 0));
    let mut out = MOut::default();
    m.start(Now::at(0), &mut out);
    m.campaign(false, &mut out);
    m.peer(Now::at(0), f1, EtcdPeer::VoteAnswer { term: 1, granted: true }, &mut out);
    assert!(m.leads());
    let client = Origin { member: 0, life: m.life, id: RequestId::new(1), client: NodeIx(3) };
    m.route(client, put("k", 0), &mut out);
    m.peer(Now::at(0), f1, EtcdPeer::AppendAnswer { term: 1, ok: true, matched: 2, read: 0 }, &mut out);
    assert_eq!((m.commit, m.applied), (2, 2), "both entries committed and applied");
    (m, out)
}

/// The request id of the read index round the leader's last heartbeat to `member` carries.
fn heartbeat_ctx(out: &MOut, member: NodeIx) -> u64 {
    let sent = out.peers.iter().rev().find_map(|(to, msg)| match msg {
        EtcdPeer::Append(a) if *to == member => Some(a.read),
        _ => None,
    });
    sent.expect("a heartbeat to the member")
}

/// etcd#20418, the leader's side, message by message as a paused leader takes up its backlog: member
/// 1's read index (id 7) is confirmed by member 1's acknowledgement; a client's read comes to the
/// leader; member 1's read loop asks again — up to 3.5.27 under id 7, from 3.5.28 under a new id 8;
/// member 2's acknowledgement of the first round comes last. Under the same id it confirms the retry
/// and the client's read queued before it, without a heartbeat sent after either; under a new id it
/// confirms nothing.
#[test]
fn a_late_acknowledgement_confirms_a_read_asked_again_under_its_id_until_3_5_28() {
    let (f1, f2) = (NodeIx(1), NodeIx(2));
    for (version, retry_id, stale) in [(Version::V3_5_13, 7, true), (Version::V3_5_28, 8, false)] {
        let (mut m, mut out) = leader_by_hand(version);
        m.peer(Now::at(10), f1, EtcdPeer::ReadIndex { asker: 1, id: 7 }, &mut out);
        let round = heartbeat_ctx(&out, f2);
        assert_eq!(round, 7, "the heartbeats carry the request id");
        out.peers.clear();
        m.peer(Now::at(20), f1, EtcdPeer::AppendAnswer { term: 1, ok: true, matched: 2, read: round }, &mut out);
        let answers: Vec<_> =
            out.peers.drain(..).filter(|(_, msg)| matches!(msg, EtcdPeer::ReadIndexAnswer { .. })).collect();
        assert!(
            matches!(answers[..], [(to, EtcdPeer::ReadIndexAnswer { id: 7, index: 2 })] if to == f1),
            "{version:?}: member 1's read index confirmed at the commit index"
        );
        let client = Origin { member: 0, life: m.life, id: RequestId::new(2), client: NodeIx(3) };
        m.route(client, get("k"), &mut out);
        m.peer(Now::at(30), f1, EtcdPeer::ReadIndex { asker: 1, id: retry_id }, &mut out);
        out.replies.clear();
        out.peers.clear();
        m.peer(Now::at(40), f2, EtcdPeer::AppendAnswer { term: 1, ok: true, matched: 2, read: round }, &mut out);
        let served: Vec<_> = out.replies.iter().map(|(id, _)| *id).collect();
        let retried = out.peers.iter().any(|(_, msg)| matches!(msg, EtcdPeer::ReadIndexAnswer { .. }));
        assert_eq!(served == [RequestId::new(2)], stale, "{version:?}: the client's read served: {served:?}");
        assert_eq!(retried, stale, "{version:?}: the retry confirmed");
    }
}

/// The asker's side: member 1 (a follower of member 0) asks for a read index and, unanswered for
/// 500 ms, asks again — up to 3.5.27 under the same request id, from 3.5.28 under a new one — and
/// serves its client's read on an answer to either id.
#[test]
fn a_read_loop_asks_again_under_a_new_id_from_3_5_28() {
    let l = NodeIx(0);
    for (version, same) in [(Version::V3_5_13, true), (Version::V3_5_28, false)] {
        let mut m = EtcdMember::new(1, vec![l, NodeIx(1), NodeIx(2)], version);
        m.rng = Some(stream(1, Stream::EtcdRaft, 1));
        let mut out = MOut::default();
        m.start(Now::at(0), &mut out);
        m.leader = Some(0);
        let asked = |out: &mut MOut| -> Vec<u64> {
            let ids = out.peers.iter().filter_map(|(to, msg)| match msg {
                EtcdPeer::ReadIndex { asker: 1, id } if *to == l => Some(*id),
                _ => None,
            });
            let ids = ids.collect();
            out.peers.clear();
            ids
        };
        let client = Origin { member: 1, life: m.life, id: RequestId::new(1), client: NodeIx(3) };
        m.route(client, get("k"), &mut out);
        let first = asked(&mut out);
        m.now_ms = READ_RETRY_MS;
        m.ask_again(&mut out);
        let again = asked(&mut out);
        assert_eq!((first.len(), again.len()), (1, 1), "{version:?}: one request each time");
        assert_eq!(first == again, same, "{version:?}: {first:?} then {again:?}");
        m.peer(Now::at(READ_RETRY_MS + 5), l, EtcdPeer::ReadIndexAnswer { id: first[0], index: 0 }, &mut out);
        assert_eq!(out.replies.len(), 1, "{version:?}: an answer to the first id serves the read");
    }
}

/// A backlog is taken in rounds, one input from each source a round, the sources' order drawn afresh
/// each round: each connection keeps its order, and the due timers come among the first round's.
#[test]
fn a_paused_members_backlog_is_taken_one_input_per_source_a_round() {
    let conn = |peer: u32| Source::Connection(Connection::on(NodeIx(peer), 0));
    // Three inputs from peer 1, one from peer 2, the timers, two from a client.
    let sources = [conn(1), conn(1), conn(2), Source::Timers, conn(1), conn(5), conn(5)];
    let mut firsts = BTreeSet::new();
    for seed in 0..40 {
        let mut m = EtcdMember::new(0, vec![NodeIx(0), NodeIx(1), NodeIx(2)], Version::V3_5_28);
        m.rng = Some(stream(seed, Stream::EtcdRaft, 0));
        let order = m.backlog_order(&sources);
        let rounds: Vec<BTreeSet<usize>> = [&order[..4], &order[4..6], &order[6..]]
            .iter()
            .map(|round| round.iter().map(|i| [1, 1, 2, 0, 1, 5, 5][*i]).collect())
            .collect();
        assert_eq!(rounds, [BTreeSet::from([0, 1, 2, 5]), BTreeSet::from([1, 5]), BTreeSet::from([1])], "{order:?}");
        let of = |peer: Source| order.iter().copied().filter(|i| sources[*i] == peer).collect::<Vec<_>>();
        assert_eq!((of(conn(1)), of(conn(5))), (vec![0, 1, 4], vec![5, 6]), "each connection in its order");
        firsts.insert(order[0]);
    }
    assert_eq!(firsts, BTreeSet::from([0, 2, 3, 5]), "any source may go first");
}

/// `lessor.Renew` on a lease the leader finds expired waits: for the revoke, and then the lease is
/// not found; or for the leader's demotion, and then the keep-alive goes to the next leader, which may
/// still keep the lease (a deposed leader resumed from a pause must not end its clients' sessions).
#[test]
fn a_keep_alive_of_an_expired_lease_waits_for_its_revoke_or_goes_to_the_next_leader() {
    let f1 = NodeIx(1);
    for demoted in [false, true] {
        let (mut m, mut out) = leader_by_hand(Version::V3_5_12);
        let (lease, _) = m.state.leases.grant(2, 0);
        out.replies.clear();
        out.peers.clear();
        m.now_ms = 5_000;
        let client = Origin { member: 0, life: m.life, id: RequestId::new(7), client: NodeIx(3) };
        m.route(client, EtcdRequest::LeaseKeepAlive { id: lease }, &mut out);
        assert!(out.replies.is_empty(), "demoted {demoted}: no answer while the lease waits for its revoke");
        if demoted {
            m.become_follower(2, Some(1), &mut out);
            let forwarded = out.peers.iter().any(|(to, msg)| {
                *to == f1 && matches!(msg, EtcdPeer::Lessor { request: EtcdRequest::LeaseKeepAlive { .. }, .. })
            });
            assert!(forwarded && out.replies.is_empty(), "the keep-alive goes to the next leader: {:?}", out.peers);
        } else {
            m.look(&mut out);
            m.peer(Now::at(5_000), f1, EtcdPeer::AppendAnswer { term: 1, ok: true, matched: 3, read: 0 }, &mut out);
            let answered = out.replies.iter().map(|(id, reply)| (*id, format!("{reply:?}"))).collect::<Vec<_>>();
            assert_eq!(answered, [(RequestId::new(7), format!("{:?}", EtcdReply::KeepAlive { id: lease, ttl_s: 0 }))]);
        }
    }
}
