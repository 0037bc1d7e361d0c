//! The client's send loop, as each library runs it: pings, the moment a connection is declared lost,
//! and re-attaching the session while disconnected ([`Library`]'s rules, here in time).

use super::{ConnState, Host, Library, Shared, KAZOO_RETRY_DELAY_US};
use crate::backend::zk::{ZkOp, ZkReply, ZkRequest};
use crate::rng::Rng;
use std::rc::Rc;
use std::time::Duration;

/// One attempt to re-attach the session on a new connection, after the library's wait: what the
/// real send thread does each time round its loop while not connected. The attempt opens its own
/// socket; one that fails (refused, or its connect timeout passed) is closed, so that a connect still
/// waiting for its SYN to get through a cut is abandoned with it (`SendThread.run` → `cleanup`).
async fn reattach(shared: &Shared) {
    let (server, wrapped) = shared.provider.next();
    let delay =
        shared.library.reattach_delay(&mut shared.host.router().jitter.borrow_mut(), &shared.retry_delay_us, wrapped);
    shared.host.sleep(delay).await;
    if shared.now() == ConnState::Expired {
        // The handle was closed meanwhile (`ZkClient::inject_expiry`): no attempt.
        return;
    }
    let timeout = shared.library.connect_timeout(shared.timeout, shared.provider.servers.len());
    shared.server.set(server);
    shared.socket.set(shared.host.open(server));
    match shared.request(shared.reattach_request(), timeout).await {
        Err(_) => {
            shared.drop_connection();
            shared.failed_reattaches.send_modify(|n| *n += 1)
        }
        Ok(ZkReply::Connected { .. }) => {
            shared.provider.connected();
            shared.reattached()
        }
        // Expired: `retry.reset()` too, before kazoo's next (new) session.
        Ok(_) => shared.retry_delay_us.set(KAZOO_RETRY_DELAY_US),
    }
}

/// Most time between the Java client's pings (`MAX_SEND_PING_INTERVAL`).
const MAX_SEND_PING_INTERVAL_MS: i64 = 10_000;

/// The library's send loop: [`send_thread`] (Java's `ClientCnxn.SendThread`, go-zookeeper's send and
/// receive loops) or [`kazoo_loop`].
pub(super) async fn pinger(shared: Rc<Shared>) {
    match shared.library {
        Library::Java | Library::Go => send_thread(shared).await,
        Library::Kazoo => kazoo_loop(shared).await,
    }
}

/// A paused node's timer fired late: the application's tasks, ready since the resume, take their next
/// step first. `wake_at`: when the timer was due.
async fn after_a_pause(clock: &Host, wake_at: i64) {
    if clock.monotonic_ms() - wake_at >= crate::backend::RESUMED_LATE.as_millis() as i64 {
        clock.sleep(Duration::from_millis(1)).await;
    }
}

/// The connection is lost (`SessionTimeoutException`, `ConnectionDropped`): closed, and a new one will be
/// opened.
fn drop_connection(shared: &Shared) {
    shared.drop_connection();
    shared.set_state(ConnState::Disconnected);
}

/// Send a ping beside the loop, so that a lost one does not delay the next look; kazoo's
/// `ping_outstanding` is cleared by its answer.
async fn send_ping(shared: &Rc<Shared>) {
    shared.host.renewal_due().await;
    let ping = ZkRequest::Op { session: shared.session, op: ZkOp::Ping };
    let pinging = shared.clone();
    shared.ping_outstanding.set(true);
    shared.host.spawn_detached(async move {
        let timeout = pinging.library.request_timeout(pinging.read_timeout());
        if pinging.request(ping, timeout).await.is_ok() {
            pinging.ping_outstanding.set(false);
        }
    });
}

/// `ClientCnxn.SendThread.run`: ping when idle for sends, declare the connection lost the moment the
/// read timeout passes without a word; while disconnected, re-attach attempt after attempt
/// ([`reattach`]). A connection closed or reset under it wakes it at once, as the socket's error
/// ends the real loop's `select`. go-zookeeper is the same but for its pings, on a fixed ticker from the
/// connection's start (`sendLoop`).
async fn send_thread(shared: Rc<Shared>) {
    let clock = &shared.host;
    let read_timeout = shared.read_timeout().as_millis() as i64;
    let mut state = shared.state.subscribe();
    let mut activity = shared.activity.subscribe();
    let mut wake_at = clock.monotonic_ms();
    loop {
        after_a_pause(clock, wake_at).await;
        let now = clock.monotonic_ms();
        let current = *state.borrow_and_update();
        activity.borrow_and_update();
        let next = match current {
            ConnState::Expired => return,
            ConnState::Disconnected => {
                reattach(&shared).await;
                wake_at = clock.monotonic_ms();
                continue;
            }
            ConnState::Connected => {
                let idle_recv = now - shared.last_heard_ms.get();
                if idle_recv >= read_timeout {
                    drop_connection(&shared);
                    continue;
                }
                let mut to_ping = ping_due_in(&shared, now, read_timeout);
                if to_ping <= 0 {
                    send_ping(&shared).await;
                    to_ping = match shared.library {
                        Library::Go => ping_due_in(&shared, now, read_timeout),
                        _ => read_timeout / 2,
                    };
                }
                (read_timeout - idle_recv).min(to_ping)
            }
        };
        let next = next.max(1);
        wake_at = clock.monotonic_ms() + next;
        // Looked at again after any send or receive, as the real loop is: a ping is due half the read
        // timeout after the last send, not at a time worked out before it.
        tokio::select! {
            biased;
            _ = state.changed() => {}
            _ = activity.changed() => {}
            () = clock.sleep(Duration::from_millis(next as u64)) => {}
        }
    }
}

/// How long until the next ping (≤ 0: now). Java (`SendThread.run`): half the read timeout after the
/// last send, less a second when idle for more than one (`readTimeout/2 - idleSend - 1000`), and at
/// least every `MAX_SEND_PING_INTERVAL`. go-zookeeper (`sendLoop`'s `pingTicker`): every
/// `pingInterval` = `recvTimeout / 2` from the connection's start, whatever was sent meanwhile.
fn ping_due_in(shared: &Shared, now: i64, read_timeout: i64) -> i64 {
    match shared.library {
        Library::Go => {
            let interval = read_timeout / 2;
            let since = now - shared.connected_ms.get();
            if since / interval > shared.ticks_pinged.get() {
                // A tick the loop has not pinged for: its ping goes now. Ticks missed meanwhile (a
                // paused process) were dropped: a `time.Ticker`'s channel holds one.
                shared.ticks_pinged.set(since / interval);
                0
            } else {
                interval - since % interval
            }
        }
        _ => {
            let idle_send = now - shared.last_sent_ms.get();
            let to_ping = read_timeout / 2 - idle_send - if idle_send > 1000 { 1000 } else { 0 };
            if idle_send > MAX_SEND_PING_INTERVAL_MS {
                0
            } else {
                to_ping
            }
        }
    }
}

/// kazoo's `ConnectionHandler._connect_attempt` loop, and its `zk_loop` around it while disconnected:
/// each time round, draw a jitter of 10–400 ms (`random.randint(1, 40) / 100`, from the node's seeded
/// re-attach stream), wait until `last_send + read_timeout/2 − jitter` (at least the jitter) or until
/// something is sent or received; a wait that ends in silence with a ping outstanding drops the
/// connection; a request sent starts the loop again (`continue`); otherwise, past the deadline, ping.
async fn kazoo_loop(shared: Rc<Shared>) {
    let clock = &shared.host;
    let half_read_timeout = shared.read_timeout().as_millis() as i64 / 2;
    let mut state = shared.state.subscribe();
    let mut activity = shared.activity.subscribe();
    let mut wake_at = clock.monotonic_ms();
    loop {
        after_a_pause(clock, wake_at).await;
        let current = *state.borrow_and_update();
        activity.borrow_and_update();
        match current {
            ConnState::Expired => return,
            ConnState::Disconnected => {
                reattach(&shared).await;
                wake_at = clock.monotonic_ms();
                continue;
            }
            ConnState::Connected => {}
        }
        let now = clock.monotonic_ms();
        let jitter = 10 * shared.host.router().jitter.borrow_mut().gen_range(1..=40i64);
        let last_send = shared.last_sent_ms.get();
        let deadline = last_send + half_read_timeout - jitter;
        let wait = (deadline - now).max(jitter);
        wake_at = now + wait;
        let silence = tokio::select! {
            biased;
            _ = state.changed() => continue,
            _ = activity.changed() => false,
            () = clock.sleep(Duration::from_millis(wait as u64)) => true,
        };
        if silence && shared.ping_outstanding.get() {
            // `ConnectionDropped("outstanding heartbeat ping not received")`.
            shared.ping_outstanding.set(false);
            drop_connection(&shared);
            continue;
        }
        if shared.last_sent_ms.get() != last_send {
            // A request went out: "Requests act as implicit pings" — `last_send` moved, look again.
            continue;
        }
        if clock.monotonic_ms() >= deadline {
            send_ping(&shared).await;
        }
    }
}
