//! The ZooKeeper client library's schedule while disconnected, and Curator's wait for a connection,
//! against the real sources: `ClientCnxn.SendThread.run` (3.8), go-zookeeper's `Conn.connect`, and
//! Curator 5's `RetryLoop.callWithRetry`.

use super::*;
use locksim_sim::fault::{Action, Fault, Target};
use std::cell::{Cell, RefCell};

/// A fault on `target` at `at_ms`.
fn fault(at_ms: u64, target: &str, action: Action) -> Fault {
    Fault { at: Duration::from_millis(at_ms), target: Target::Node(target.into()), action, on: None }
}

/// The server's process dies at 1 s and starts again `restart_ms` later: connections to it are refused
/// meanwhile.
fn server_down(restart_ms: u64) -> Fault {
    fault(1_000, "zk-0", Action::Crash { restart_after: Some(Duration::from_millis(restart_ms)), host: false })
}

/// The client is cut off from the server from 1 s for `ms`.
fn cut(ms: u64) -> Fault {
    fault(
        1_000,
        "client-0",
        Action::Partition { peers: vec!["zk-0".into()], duration: Some(Duration::from_millis(ms)) },
    )
}

/// Run `app` on a client node beside one ZooKeeper server (tick 2 s) under `faults`, with a session of
/// 6 s speaking as `library`; what `app` returns.
fn run<T: Send + 'static, F: std::future::Future<Output = T> + 'static>(
    library: Library,
    faults: Vec<Fault>,
    app: impl Fn(Ctx, ZkClient) -> F + Send + Sync + 'static,
) -> T {
    let out = Arc::new(Mutex::new(None));
    let seen = out.clone();
    let app = Arc::new(app);
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let mut world = World::new(1);
        let servers = deploy(&mut world, &Params::resolve(BACKEND_PARAMS, []));
        let client: Program = Arc::new(move |env| {
            let (servers, seen, app) = (servers.clone(), seen.clone(), app.clone());
            Box::pin(async move {
                let ctx = Ctx::new(&env, Rc::new(env.rpc()));
                let session = ZkSession::new(&ctx, &servers, Duration::from_secs(6)).speaking(library);
                let zk = session.live().await.expect("the server answers at the start");
                let result = app(ctx, zk).await;
                *seen.lock().unwrap() = Some(result);
            })
        });
        world.add_node("client-0", client);
        world.run(&faults, Duration::from_secs(60)).await;
    });
    let result = out.lock().unwrap().take().expect("the application ran to its end");
    result
}

/// Once the client is disconnected, call `exists` again and again until `until_ms`: the times (ms
/// since the start) at which each call failed. A request made while disconnected waits for the next
/// connect attempt and fails with it (`ClientCnxn.cleanup` fails the `outgoingQueue`; go-zookeeper
/// flushes its unsent requests at each cycle), so these are the ends of the connect attempts.
async fn failures_while_disconnected(ctx: Ctx, zk: ZkClient, until_ms: i64) -> Vec<i64> {
    let mut state = zk.state();
    while *state.borrow_and_update() != ConnState::Disconnected {
        state.changed().await.expect("the session lives");
    }
    let mut failed = Vec::new();
    while ctx.monotonic_ms() < until_ms {
        match zk.exists("/x").await {
            Err(ClientError::ConnectionLoss) => failed.push(ctx.monotonic_ms()),
            other => panic!("still disconnected at {} ms, yet {other:?}", ctx.monotonic_ms()),
        }
    }
    failed
}

fn gaps(times: &[i64]) -> Vec<i64> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

#[test]
fn the_java_client_reattaches_after_one_second_and_a_random_second_while_refused() {
    // `StaticHostProvider.next(1000)` sleeps 1 s once it has tried its one server; `startConnect`
    // sleeps `nextLong(1000)` ms more; a refused connection fails at once.
    let failed = run(Library::Java, vec![server_down(20_000)], |ctx, zk| failures_while_disconnected(ctx, zk, 15_000));
    let gaps = gaps(&failed);
    assert!(gaps.len() >= 6, "an attempt every 1–2 s: {failed:?}");
    assert!(gaps.iter().all(|g| (1_000..2_020).contains(g)), "1 s + random(0..1 s) + the RST's way back: {gaps:?}");
    assert!(gaps.iter().any(|g| *g != gaps[0]), "the second is drawn anew each time: {gaps:?}");
}

#[test]
fn the_java_client_gives_a_connect_attempt_the_whole_session_timeout() {
    // While CONNECTING the send thread's timeout is `connectTimeout` = negotiated T / 1 server (6 s);
    // then SessionTimeoutException, cleanup, and 1–2 s before the next attempt.
    let failed = run(Library::Java, vec![cut(40_000)], |ctx, zk| failures_while_disconnected(ctx, zk, 35_000));
    let gaps = gaps(&failed);
    assert!(gaps.len() >= 2, "{failed:?}");
    assert!(gaps.iter().all(|g| (7_000..8_000).contains(g)), "1 s + random(0..1 s) + 6 s: {gaps:?}");
}

#[test]
fn go_zookeeper_retries_every_second_and_dials_for_one() {
    // `Conn.connect`: the host provider's `retryStart` → `flushUnsentRequests(ErrNoServer)`, then
    // `time.After(time.Second)`, then `dialer("tcp", server, connectTimeout)` with 1 s; no jitter.
    let refused = run(Library::Go, vec![server_down(20_000)], |ctx, zk| failures_while_disconnected(ctx, zk, 15_000));
    let gaps_refused = gaps(&refused);
    assert!(gaps_refused.len() >= 8 && gaps_refused.iter().all(|g| (1_000..1_020).contains(g)), "{refused:?}");
    let cut_off = run(Library::Go, vec![cut(40_000)], |ctx, zk| failures_while_disconnected(ctx, zk, 35_000));
    let gaps_cut = gaps(&cut_off);
    assert!(gaps_cut.len() >= 8 && gaps_cut.iter().all(|g| (2_000..2_010).contains(g)), "{cut_off:?}");
}

/// When each call of a `retried` operation ran (ms since the start): the client is disconnected at
/// `from_ms` and its calls all fail with a connection loss.
async fn retried_calls(ctx: Ctx, zk: ZkClient, from_ms: i64) -> Vec<i64> {
    ctx.sleep(Duration::from_millis((from_ms - ctx.monotonic_ms()) as u64)).await;
    assert_eq!(*zk.state().borrow_and_update(), ConnState::Disconnected);
    let calls = Rc::new(RefCell::new(Vec::new()));
    let result: Result<(), _> = retried(&ctx, &zk, || {
        calls.borrow_mut().push(ctx.monotonic_ms());
        std::future::ready(Err(ClientError::ConnectionLoss))
    })
    .await;
    assert_eq!(result, Err(ClientError::ConnectionLoss));
    calls.take()
}

#[test]
fn curators_retry_loop_first_waits_for_a_connection_for_fifteen_seconds() {
    // `RetryLoop.callWithRetry` → `internalBlockUntilConnectedOrTimedOut`: at most `connectionTimeoutMs`
    // (15 s by default) while not connected, once, before the first try; the retries do not wait again.
    let calls = run(Library::Java, vec![server_down(40_000)], |ctx, zk| retried_calls(ctx, zk, 2_000));
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(calls[0], 17_000, "the first try after 15 s of waiting: {calls:?}");
    // Connected again before the 15 s are up: the first try runs at the reconnection.
    let calls = run(Library::Java, vec![server_down(3_000)], |ctx, zk| retried_calls(ctx, zk, 2_000));
    assert!((4_000..6_100).contains(&calls[0]), "at the first attempt after the restart at 4 s: {calls:?}");
}

/// `retried` on a connected client, over a call that loses the connection `losses` times first:
/// (result, calls made, ms taken).
async fn retried_losing(ctx: Ctx, zk: ZkClient, losses: u32) -> (Result<u32, ClientError>, u32, i64) {
    let calls = Cell::new(0u32);
    let start = ctx.monotonic_ms();
    let result = retried(&ctx, &zk, || {
        calls.set(calls.get() + 1);
        std::future::ready(if calls.get() <= losses { Err(ClientError::ConnectionLoss) } else { Ok(calls.get()) })
    })
    .await;
    (result, calls.get(), ctx.monotonic_ms() - start)
}

#[test]
fn curators_retry_loop_outlasts_three_connection_losses_and_not_four() {
    let (result, calls, took) = run(Library::Java, vec![], |ctx, zk| retried_losing(ctx, zk, 3));
    assert_eq!((result, calls), (Ok(4), 4), "three retries, then the answer");
    assert!((3_000..=14_000).contains(&took), "slept 1 s × random(1..2^n) before each retry: {took} ms");
    let (result, calls, _) = run(Library::Java, vec![], |ctx, zk| retried_losing(ctx, zk, 4));
    assert_eq!((result, calls), (Err(ClientError::ConnectionLoss), 4), "the policy's retries ran out");
}

#[test]
fn the_java_client_pings_half_the_read_timeout_after_its_last_request() {
    // Session 6 s: read timeout 4 s, a ping due 2 s after the last send. A request at 0.5 s puts the
    // ping at 2.5 s, inside a cut from 2.2 s: the last word from the server was the reply at 0.5 s, and
    // the client is disconnected at 4.5 s. (Before, the ping went out at 2 s, on a schedule worked out
    // at the connect, and the client held on until 6 s.)
    let cut_at_2200 = fault(
        2_200,
        "client-0",
        Action::Partition { peers: vec!["zk-0".into()], duration: Some(Duration::from_secs(20)) },
    );
    let disconnected = run(Library::Java, vec![cut_at_2200], |ctx, zk| async move {
        ctx.sleep(Duration::from_millis(500)).await;
        zk.exists("/x").await.expect("answered");
        let mut state = zk.state();
        while *state.borrow_and_update() != ConnState::Disconnected {
            state.changed().await.expect("the session lives");
        }
        ctx.monotonic_ms()
    });
    assert!((4_500..4_600).contains(&disconnected), "disconnected at {disconnected} ms");
}

/// When the client is first `Disconnected` (ms since the start).
async fn disconnected_at(ctx: &Ctx, zk: &ZkClient) -> i64 {
    let mut state = zk.state();
    while *state.borrow_and_update() != ConnState::Disconnected {
        state.changed().await.expect("the session lives");
    }
    ctx.monotonic_ms()
}

/// A cut of the client from `at_ms` for 20 s.
fn cut_from(at_ms: u64) -> Fault {
    fault(at_ms, "client-0", Action::Partition { peers: vec!["zk-0".into()], duration: Some(Duration::from_secs(20)) })
}

/// Session 6 s (read timeout 4 s), a request answered at 0.5 s, cut off from 2 s; with `ask_ms`, one more
/// request sent into the cut then. When the client is disconnected.
fn disconnect_in_a_cut(library: Library, ask_ms: Option<u64>) -> i64 {
    run(library, vec![cut_from(2_000)], move |ctx, zk| async move {
        ctx.sleep(Duration::from_millis(500)).await;
        zk.exists("/x").await.expect("answered");
        let (asking, sleeper) = (zk.clone(), ctx.clone());
        let _asker = ctx.spawn(async move {
            if let Some(at) = ask_ms {
                sleeper.sleep(Duration::from_millis(at - 500)).await;
                let _ = asking.exists("/x").await;
            }
        });
        disconnected_at(&ctx, &zk).await
    })
}

#[test]
fn kazoo_is_disconnected_by_an_unanswered_ping_a_jittered_read_timeout_after_its_last_send() {
    // `_connect_attempt`: a ping `last_send + read_timeout/2 − jitter` (jitter 10–400 ms) after the
    // request at 0.5 s — into the cut — and, the next wait ending in silence with it outstanding,
    // `ConnectionDropped` up to another half read timeout less a jitter later: 3.7–4.48 s. The Java
    // client: a read timeout after the last word from the server, 4.5 s.
    let kazoo = disconnect_in_a_cut(Library::Kazoo, None);
    assert!((3_700..4_490).contains(&kazoo), "kazoo disconnected at {kazoo} ms");
    let java = disconnect_in_a_cut(Library::Java, None);
    assert!((4_500..4_600).contains(&java), "Java disconnected at {java} ms");
}

#[test]
fn a_request_sent_into_a_cut_puts_kazoos_disconnection_back_and_not_javas() {
    // "Requests act as implicit pings": a request at 3 s moves `last_send`, so the outstanding ping is
    // given up on only half a read timeout (less a jitter) after it, 4.6–5 s. Java's read timeout
    // counts from the last word heard, whatever is sent: 4.5 s either way.
    let kazoo = disconnect_in_a_cut(Library::Kazoo, Some(3_000));
    assert!((4_600..5_010).contains(&kazoo), "kazoo disconnected at {kazoo} ms");
    let java = disconnect_in_a_cut(Library::Java, Some(3_000));
    assert!((4_500..4_600).contains(&java), "Java disconnected at {java} ms");
}

/// The server is killed at 1 s and back `down_ms` later; the client asks at `ask_ms`: when it is
/// re-attached, and when and how the request ended.
fn across_a_server_kill(library: Library, down_ms: u64, ask_ms: u64) -> (i64, i64, Result<(), ClientError>) {
    run(library, vec![server_down(down_ms)], move |ctx, zk| async move {
        disconnected_at(&ctx, &zk).await;
        ctx.sleep(Duration::from_millis(ask_ms - ctx.monotonic_ms() as u64)).await;
        let asked = zk.exists("/x").await.map(drop);
        let answered = ctx.monotonic_ms();
        let mut state = zk.state();
        while *state.borrow_and_update() != ConnState::Connected {
            state.changed().await.expect("the session lives");
        }
        (ctx.monotonic_ms(), answered, asked)
    })
}

#[test]
fn kazoo_reattaches_a_tenth_of_a_second_after_a_kill_and_backs_off_from_there() {
    // `KazooRetry`: sleeps of 0.1 s × uniform(0.6, 1.4), each next delay twice the last sleep. Down for
    // 300 ms, the server is back before the 1 s + random second the Java client waits at least.
    let (kazoo, _, _) = across_a_server_kill(Library::Kazoo, 300, 1_050);
    assert!((1_300..1_900).contains(&kazoo), "kazoo re-attached at {kazoo} ms");
    let (java, _, _) = across_a_server_kill(Library::Java, 300, 1_050);
    assert!(java >= 2_000, "Java re-attached at {java} ms");
}

#[test]
fn kazoo_queues_a_request_made_while_disconnected_until_the_session_is_back() {
    // Down for 5 s: kazoo's `_call` queues the request while CONNECTING and refused attempts leave it
    // there; it is answered on the re-attached session. The Java client fails it with the first
    // refused attempt (`ClientCnxn.cleanup`).
    let (back, answered, asked) = across_a_server_kill(Library::Kazoo, 5_000, 1_500);
    assert_eq!(asked, Ok(()), "answered after the restart");
    assert!(answered >= 6_000 && answered >= back, "answered at {answered} ms, re-attached at {back} ms");
    let (_, failed, asked) = across_a_server_kill(Library::Java, 5_000, 1_500);
    assert_eq!(asked, Err(ClientError::ConnectionLoss));
    assert!(failed < 3_600, "failed with the first refused attempt, at {failed} ms");
}

#[test]
fn kazoo_is_lost_only_when_its_session_expired() {
    // `lost_on = "lost"`: Curator 3 also says LOST a session timeout after SUSPENDED (here 4 + 6 s);
    // kazoo only when the re-attach after the heal at 22 s finds the session expired.
    let lost_at = |library| {
        run(library, vec![cut_from(2_000)], |ctx, zk| async move {
            let why = lost(&zk, "lost", &ctx).await;
            (ctx.monotonic_ms(), why)
        })
    };
    let (curator, why) = lost_at(Library::Java);
    assert!((10_000..10_100).contains(&curator), "{why} at {curator} ms");
    let (kazoo, why) = lost_at(Library::Kazoo);
    assert!(kazoo >= 22_000 && why == "session expired", "{why} at {kazoo} ms");
}

#[test]
fn go_zookeeper_pings_on_a_fixed_ticker_whatever_it_sent() {
    // `sendLoop`'s `pingTicker` (every recvTimeout/2 = 2 s from the connection) pings at 2 s although a
    // request went at 0.5 s: the ping is answered before the cut at 2.2 s, and the read deadline
    // (`recvTimeout` = 4 s after the last read) runs out at 6 s. Java's ping, half the read timeout
    // after the last send, went into the cut at 2.5 s: disconnected at 4.5 s.
    let at_2200 = |library| {
        run(library, vec![cut_from(2_200)], |ctx, zk| async move {
            ctx.sleep(Duration::from_millis(500)).await;
            zk.exists("/x").await.expect("answered");
            disconnected_at(&ctx, &zk).await
        })
    };
    let go = at_2200(Library::Go);
    assert!((6_000..6_100).contains(&go), "go-zookeeper disconnected at {go} ms");
    let java = at_2200(Library::Java);
    assert!((4_500..4_600).contains(&java), "Java disconnected at {java} ms");
}
