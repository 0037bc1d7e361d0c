use super::tcp::TCP_RTO_MIN_NS;
use super::*;

const A: NodeIx = NodeIx(0);
const B: NodeIx = NodeIx(1);

fn in_world(f: impl FnOnce(&Net) + 'static) {
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let net = Net::new(1);
        net.bind_host(A, 0);
        net.bind_host(B, 0);
        f(&net);
    });
}

/// [`in_world`] for a test that lets simulated time pass.
fn in_world_async<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce(Net) -> F + 'static) {
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let net = Net::new(1);
        net.bind_host(A, 0);
        net.bind_host(B, 0);
        f(net).await;
    });
}

async fn sleep_until(at_ns: u64) {
    crate::clock::sleep(Duration::from_nanos(at_ns - sim_now_ns())).await;
}

/// `waiter` waits on a call with `tag` to `peer` (on their shared socket).
fn wait_on(net: &Net, waiter: NodeIx, peer: NodeIx, tag: u64) {
    wait_on_socket(net, waiter, peer, 0, tag);
}

/// `waiter` waits on a call with `tag` to `peer` on `socket`.
fn wait_on_socket(net: &Net, waiter: NodeIx, peer: NodeIx, socket: u32, tag: u64) {
    let waiting = Waiting { peer, socket, reply: None, caller: None, deadline_ns: u64::MAX };
    net.state().inboxes.get_mut(&waiter).unwrap().waiting.push((tag, waiting));
}

fn tell(net: &Net, from: NodeIx, to: NodeIx, tag: u64) {
    net.send(from, to, Message::Request { reply_tag: tag, body: Box::new(()), conn: None });
}

/// The reply tags waiting in `to`'s inbox, with their arrival times.
fn queued(net: &Net, to: NodeIx) -> Vec<(u64, u64)> {
    let mut queued: Vec<_> = net.state().inboxes[&to].requests.iter().map(|q| (q.at, q.request.0.reply_tag)).collect();
    queued.sort();
    queued.into_iter().map(|((at, _), tag)| (at, tag)).collect()
}

#[test]
fn messages_on_one_link_never_overtake_each_other() {
    in_world(|net| {
        let mut s = net.state();
        let arrivals: Vec<u64> = (0..50).map(|_| s.route(A, B, 0, 0).unwrap()).collect();
        assert!(arrivals.windows(2).all(|w| w[0] <= w[1]));
        assert!(arrivals[0] >= LATENCY_NS.0 && arrivals[0] <= LATENCY_NS.1);
    });
}

#[test]
fn a_loss_probe_then_retransmissions_back_off_from_200ms_and_give_up_after_15() {
    let s = 1_000_000_000;
    // Sent at 0: probed at 0.2 s, retransmitted at 0.4, 0.8, 1.6, 3.2, 6.4 s …
    assert_eq!(retransmission_after(0, 0), Some(200_000_000));
    assert_eq!(retransmission_after(0, 300_000_000), Some(400_000_000));
    assert_eq!(retransmission_after(0, 500_000_000), Some(800_000_000), "a real kernel: 0.83 s");
    assert_eq!(retransmission_after(0, 1_200_000_000), Some(1_600_000_000), "a real kernel: 1.67 s");
    assert_eq!(retransmission_after(0, 5 * s), Some(6_400_000_000));
    // … then every 120 s once the timeout has stopped doubling; the 15th is at 804.8 s.
    assert_eq!(retransmission_after(0, 800 * s), Some(804_800_000_000));
    assert_eq!(retransmission_after(0, 805 * s), None, "tcp_retries2: the connection is given up");
}

#[test]
fn a_cut_link_delays_every_message_until_a_retransmission_after_the_heal() {
    in_world(|net| {
        net.cut(A, B, true);
        tell(net, A, B, 0);
        tell(net, A, B, 7);
        tell(net, B, A, 9);
        assert!(queued(net, B).is_empty(), "nothing crosses a cut link");
        assert_eq!(queued(net, A).len(), 1, "the other direction is up");
        net.cut(A, B, false);
        let arrived = queued(net, B);
        assert_eq!(arrived.iter().map(|(_, tag)| *tag).collect::<Vec<_>>(), vec![0, 7], "in order");
        assert!(arrived.iter().all(|(at, _)| *at >= TCP_RTO_MIN_NS), "at the first retransmission");
        // Sent after the heal, before the retransmission: still behind what was held.
        tell(net, A, B, 8);
        let last = queued(net, B);
        assert_eq!(last.last().unwrap().1, 8);
        assert!(last.windows(2).all(|w| w[0].0 <= w[1].0));
    });
}

#[test]
fn a_stream_with_a_read_timeout_loses_what_a_longer_cut_held() {
    let cut_for = |read_timeout: bool, cut: Duration| {
        let (tx, rx) = std::sync::mpsc::channel();
        in_world_async(move |net| async move {
            if read_timeout {
                net.set_read_timeout(&[A, B], Duration::from_secs(5));
            }
            net.cut(A, B, true);
            tell(&net, A, B, 1);
            sleep_until(cut.as_nanos() as u64).await;
            net.cut(A, B, false);
            tell(&net, A, B, 2);
            let tags: Vec<u64> = queued(&net, B).iter().map(|(_, tag)| *tag).collect();
            tx.send(tags).unwrap();
        });
        rx.recv().unwrap()
    };
    assert_eq!(cut_for(true, Duration::from_secs(2)), vec![1, 2], "a short cut: the stream lives on");
    assert_eq!(cut_for(true, Duration::from_secs(8)), vec![2], "the receiver closed the stream: only what follows");
    assert_eq!(cut_for(false, Duration::from_secs(8)), vec![1, 2], "a plain connection delivers at the heal");
}

#[test]
fn held_messages_die_with_either_end() {
    in_world(|net| {
        net.cut(A, B, true);
        tell(net, A, B, 1);
        net.unbind(B);
        net.bind_host(B, 1);
        net.cut(A, B, false);
        assert!(queued(net, B).is_empty(), "a restarted receiver resets the old connection");
        net.cut(A, B, true);
        tell(net, A, B, 2);
        net.unbind(A);
        net.bind_host(A, 1);
        net.cut(A, B, false);
        assert!(queued(net, B).is_empty(), "a crashed sender's kernel buffers are gone");
    });
}

#[test]
fn a_crashed_node_sends_nothing() {
    in_world(|net| {
        net.unbind(A);
        // Node 0 has no inbox: it has crashed, and its dying tasks' last words are lost.
        tell(net, A, B, 0);
        assert!(queued(net, B).is_empty());
        assert_eq!(net.messages(), 0);
    });
}

#[test]
fn a_killed_process_kernel_closes_its_connections_and_resets_what_comes_after() {
    in_world(|net| {
        tell(net, A, B, 0);
        // B waits on a call to A when A's process dies.
        wait_on(net, B, A, 5);
        net.kill_process(A);
        let mut s = net.state();
        let closed = s.inboxes[&B].closed.clone();
        assert_eq!(closed.len(), 1, "B had a connection with A: it sees the close");
        let (at, peer, life, socket) = closed[0];
        assert_eq!((peer, life, socket), (A, 0, None), "every connection of the process");
        assert!(at >= s.link_clear_ns[&(A, B, 0)] && at <= LATENCY_NS.1, "one network delay later");
        let reply = s.inboxes.get_mut(&B).unwrap().waiting(5).unwrap().reply.take();
        assert!(matches!(reply, Some((_, 0, Err(CallError::Reset)))), "its call ends with a reset");
        drop(s);
        // The host is up: a new call is refused at once, a probe is reset, the dead process sends nothing.
        wait_on(net, B, A, 6);
        net.send(B, A, Message::Request { reply_tag: 6, body: Box::new(()), conn: None });
        assert!(net
            .state()
            .inboxes
            .get_mut(&B)
            .unwrap()
            .waiting(6)
            .unwrap()
            .reply
            .as_ref()
            .is_some_and(|r| matches!(r.2, Err(CallError::Reset))));
        let rpc_b = Rpc::bind(net, &Clock::default(), B, 0);
        assert_eq!(rpc_b.probe(A, 0), Probe::Reset);
        let before = net.messages();
        tell(net, A, B, 1);
        assert_eq!(net.messages(), before);
    });
}

#[test]
fn a_dead_hosts_peers_hear_nothing() {
    in_world(|net| {
        tell(net, A, B, 0);
        net.unbind(A);
        assert!(net.state().inboxes[&B].closed.is_empty());
    });
}

#[test]
fn a_close_on_a_cut_link_waits_for_the_heal() {
    in_world(|net| {
        tell(net, A, B, 0);
        net.cut(A, B, true);
        net.kill_process(A);
        assert!(net.state().inboxes[&B].closed.is_empty(), "held by the cut");
        net.cut(A, B, false);
        assert_eq!(net.state().inboxes[&B].closed.len(), 1, "retransmitted after the heal");
    });
}

#[test]
fn delay_adds_to_the_latency() {
    in_world(|net| {
        let mut s = net.state();
        s.delay.insert(B, Duration::from_secs(1));
        let at = s.route(A, B, 0, 0).unwrap();
        assert!(at >= 1_000_000_000 + LATENCY_NS.0);
    });
}

#[test]
fn a_request_on_a_connection_to_an_earlier_life_is_reset_and_not_applied() {
    in_world(|net| {
        net.unbind(B);
        net.bind_host(B, 1);
        wait_on(net, A, B, 7);
        net.send(A, B, Message::Request { reply_tag: 7, body: Box::new(()), conn: Some(0) });
        assert!(queued(net, B).is_empty(), "not applied");
        let reset = net.state().inboxes.get_mut(&A).unwrap().waiting(7).unwrap().reply.take();
        let (_, life, body) = reset.expect("a reset comes back");
        assert!(matches!(body, Err(CallError::Reset)), "a reset carries no reply");
        assert_eq!(life, 1);
        net.send(A, B, Message::Request { reply_tag: 8, body: Box::new(()), conn: Some(1) });
        assert_eq!(queued(net, B).len(), 1, "a connection to the live host gets through");
    });
}

#[test]
fn a_lost_message_is_retransmitted_not_removed() {
    in_world(|net| {
        // Everything to B is lost for 1 s: TCP sends again at 0.2, 0.4, 0.8 and 1.6 s; the last gets through.
        net.set_loss(B, Some(1.0), Some(Duration::from_secs(1)));
        tell(net, A, B, 3);
        tell(net, A, B, 4);
        let arrived = queued(net, B);
        assert_eq!(arrived.iter().map(|(_, tag)| *tag).collect::<Vec<_>>(), vec![3, 4], "in order");
        assert!(arrived.iter().all(|(at, _)| *at >= 1_600_000_000 && *at <= 1_600_000_000 + LATENCY_NS.1));
    });
}

#[test]
fn a_partly_lost_link_delays_by_whole_retransmission_timeouts() {
    in_world(|net| {
        let mut s = net.state();
        s.loss.insert(B, (0.5, u64::MAX));
        // Sent 10 s apart, so that none waits behind an earlier one.
        let sent = (0..200).map(|i| i * 10_000_000_000);
        let delays: Vec<u64> = sent.map(|at| s.route(A, B, 0, at).expect("nothing is removed") - at).collect();
        let late = delays.iter().filter(|d| **d >= TCP_RTO_MIN_NS).count();
        assert!((60..140).contains(&late), "about half wait for a retransmission: {late}");
        assert!(delays.iter().all(|d| *d <= LATENCY_NS.1 || *d >= TCP_RTO_MIN_NS), "whole timeouts");
    });
}

#[test]
fn a_dropped_reply_breaks_the_connection_after_the_request_was_applied() {
    in_world(|net| {
        net.set_drop_reply(B, Some(1.0));
        wait_on(net, A, B, 5);
        net.send(A, B, Message::Request { reply_tag: 5, body: Box::new(()), conn: None });
        assert_eq!(queued(net, B).len(), 1, "the request goes through");
        net.send(B, A, Message::Reply { tag: 5, body: Ok(Box::new(())), life: 0 });
        let reply = net.state().inboxes.get_mut(&A).unwrap().waiting(5).unwrap().reply.take();
        assert!(matches!(reply, Some((_, 0, Err(CallError::Broken)))), "the caller hears its connection break");
        // A request still goes through, and so does what the server sends on its own.
        tell(net, B, A, 0);
        assert_eq!(queued(net, A).len(), 1);
    });
}

#[test]
fn a_connection_opened_during_a_cut_has_its_own_retransmission_schedule() {
    in_world_async(|net| async move {
        net.cut(A, B, true);
        tell(&net, A, B, 1);
        // B restarts 10 s into the cut; A's next message opens a connection to its new life.
        sleep_until(10_000_000_000).await;
        net.unbind(B);
        net.bind_host(B, 1);
        tell(&net, A, B, 2);
        sleep_until(10_500_000_000).await;
        net.cut(A, B, false);
        // Its own schedule: 10.2, 10.4, 10.8 s — not the old connection's 6.4, 12.8 s.
        let arrived = queued(&net, B);
        assert_eq!(arrived.len(), 1, "the old connection's data is reset");
        assert!(arrived[0].0 >= 10_800_000_000 && arrived[0].0 <= 10_800_000_000 + LATENCY_NS.1, "{arrived:?}");
    });
}

#[test]
fn an_orphaned_socket_gives_up_after_tcp_orphan_retries() {
    for (heal_s, delivered) in [(50, true), (60, false)] {
        in_world_async(move |net| async move {
            net.cut(A, B, true);
            tell(&net, A, B, 1);
            net.kill_process(A);
            // Probed at 0.2 s, retransmitted at 0.4, 0.8, … 51.2 s (the 8th); then given up, not after 15 min.
            sleep_until(heal_s * 1_000_000_000).await;
            net.cut(A, B, false);
            assert_eq!(!queued(&net, B).is_empty(), delivered, "healed at {heal_s} s");
            assert_eq!(!net.state().inboxes[&B].closed.is_empty(), delivered, "the FIN too");
        });
    }
}

/// `A`'s endpoint, for calls on sockets of its own.
fn rpc_a(net: &Net) -> Rpc {
    Rpc::bind(net, &Clock::default(), A, 0)
}

/// `from` sends a request with `tag` to `to` on `socket`.
fn tell_on(net: &Net, from: NodeIx, to: NodeIx, Socket(socket): Socket, tag: u64) {
    let request = Message::Request { reply_tag: tag, body: Box::new(()), conn: None };
    net.state().send(from, to, socket, request, sim_now_ns());
}

/// The reply tags of the requests `to`'s server reads now, in order ([`Inbox::take_request`]: data
/// on a socket the server has closed is not read).
fn requests_read(net: &Net, to: NodeIx) -> Vec<u64> {
    let s = &mut *net.state();
    let inbox = s.inboxes.get_mut(&to).unwrap();
    let read = std::iter::from_fn(|| inbox.take_request(to, sim_now_ns(), &s.sockets));
    read.map(|(reply_to, _)| reply_to.reply_tag).collect()
}

#[test]
fn syns_back_off_from_1s_and_give_up_after_tcp_syn_retries() {
    let s = 1_000_000_000;
    // Sent at 0: retransmitted at 1, 3, 7, 15, 31, 63 s; `connect` fails at 127 s.
    let at = |heal_s: u64| syn_retransmission_after(0, heal_s * s).map(|ns| ns / s);
    assert_eq!([at(0), at(2), at(4), at(8), at(16), at(40)], [1, 3, 7, 15, 31, 63].map(Some));
    assert_eq!(at(64), None, "tcp_syn_retries");
}

#[test]
fn a_reconnect_after_a_cut_is_not_delayed_by_the_old_connections_retransmissions() {
    in_world_async(|net| async move {
        let rpc = rpc_a(&net);
        let old = rpc.open(B);
        tell_on(&net, A, B, old, 0);
        net.cut(A, B, true);
        tell_on(&net, A, B, old, 1);
        // The client gives the connection up 2 s into the cut and reconnects after the heal at
        // 7 s: the old socket retransmits at 6.4 and 12.8 s, the new one sends at once.
        sleep_until(2_000_000_000).await;
        rpc.close(B, old);
        sleep_until(7_000_000_000).await;
        net.cut(A, B, false);
        let new = rpc.open(B);
        tell_on(&net, A, B, new, 2);
        let arrived = queued(&net, B);
        let at = |tag| arrived.iter().find(|(_, t)| *t == tag).unwrap().0;
        assert!(at(2) <= 7_000_000_000 + LATENCY_NS.1, "{arrived:?}");
        assert!(at(1) >= 12_800_000_000, "the orphan still retransmits on its own schedule: {arrived:?}");
    });
}

#[test]
fn a_connect_into_a_cut_gets_through_at_the_first_syn_retransmission_after_the_heal() {
    for (heal_ms, through_ms) in [(500, 1000), (2500, 3000), (5000, 7000)] {
        in_world_async(move |net| async move {
            net.cut(A, B, true);
            let socket = rpc_a(&net).open(B);
            tell_on(&net, A, B, socket, 1);
            sleep_until(heal_ms * 1_000_000).await;
            net.cut(A, B, false);
            let arrived = queued(&net, B);
            let through_ns = through_ms * 1_000_000;
            assert!(arrived.len() == 1 && arrived[0].0 >= through_ns, "healed at {heal_ms} ms: {arrived:?}");
            assert!(arrived[0].0 <= through_ns + LATENCY_NS.1, "healed at {heal_ms} ms: {arrived:?}");
        });
    }
}

#[test]
fn an_abandoned_connect_is_never_delivered() {
    in_world_async(|net| async move {
        let rpc = rpc_a(&net);
        net.cut(A, B, true);
        let socket = rpc.open(B);
        tell_on(&net, A, B, socket, 1);
        // The client's connect timeout passes at 2 s: it closes the socket in `SYN_SENT`.
        sleep_until(2_000_000_000).await;
        rpc.close(B, socket);
        net.cut(A, B, false);
        sleep_until(200_000_000_000).await;
        assert!(queued(&net, B).is_empty());
        assert!(net.state().held.is_empty(), "nothing left to retransmit");
    });
}

#[test]
fn a_closed_sockets_data_is_an_orphan_and_not_read_once_the_new_connection_was() {
    in_world_async(|net| async move {
        let rpc = rpc_a(&net);
        let old = rpc.open(B);
        tell_on(&net, A, B, old, 0);
        net.cut(A, B, true);
        tell_on(&net, A, B, old, 1);
        rpc.close(B, old);
        // An orphan: 8 retransmissions after the probe, the last at 51.2 s, given up at 102.4 s rather than after 15 min.
        assert_eq!(net.state().held.values().map(|h| h.retries).collect::<Vec<_>>(), [TCP_ORPHAN_RETRIES]);
        let new = rpc.open(B);
        tell_on(&net, A, B, new, 2);
        sleep_until(5_000_000_000).await;
        net.cut(A, B, false);
        sleep_until(10_000_000_000).await;
        let tags = requests_read(&net, B);
        // The orphan's data goes at 6.4 s, the new socket's SYN (sent at 0) at 7 s: the old
        // request is read, the server not having heard from the new connection yet.
        assert_eq!(tags, [0, 1, 2]);
    });
}

#[test]
fn data_on_a_closed_socket_arriving_after_the_new_connection_is_not_read() {
    in_world_async(|net| async move {
        let rpc = rpc_a(&net);
        let old = rpc.open(B);
        tell_on(&net, A, B, old, 0);
        net.cut(A, B, true);
        sleep_until(1_000_000_000).await;
        tell_on(&net, A, B, old, 1);
        rpc.close(B, old);
        // Healed at 7.5 s: the orphan retransmits at 7.4 and 13.8 s, the new socket's SYN (sent at
        // 7 s) at 8 s.
        sleep_until(7_000_000_000).await;
        let new = rpc.open(B);
        tell_on(&net, A, B, new, 2);
        sleep_until(7_500_000_000).await;
        net.cut(A, B, false);
        sleep_until(20_000_000_000).await;
        let tags = requests_read(&net, B);
        assert_eq!(tags, [0, 2], "the server closed the old connection when it read the new one");
    });
}

#[test]
fn a_server_closes_one_connection_and_its_client_hears_of_that_one_only() {
    in_world_async(|net| async move {
        // Client A has two connections to server B: an old one and a new one, a call waiting on each.
        let a = rpc_a(&net);
        let (old, new) = (a.open(B), a.open(B));
        tell_on(&net, A, B, old, 1);
        tell_on(&net, A, B, new, 2);
        sleep_until(20_000_000).await;
        assert_eq!(requests_read(&net, B), [1, 2]);
        let (Socket(old_n), Socket(new_n)) = (old, new);
        wait_on_socket(&net, A, B, old_n, 1);
        wait_on_socket(&net, A, B, new_n, 2);
        let now = sim_now_ns();
        Rpc::bind(&net, &Clock::default(), B, 0).close_connection(Connection { peer: A, socket: old_n });
        {
            let mut s = net.state();
            let closed = s.inboxes[&A].closed.clone();
            let [(at, peer, life, socket)] = closed[..] else { panic!("one close: {closed:?}") };
            assert_eq!((peer, life, socket), (B, 0, Some(old_n)), "the one socket, not the process");
            assert!((now + LATENCY_NS.0..=now + LATENCY_NS.1).contains(&at), "one network delay later");
            let inbox = s.inboxes.get_mut(&A).unwrap();
            assert!(matches!(inbox.waiting(1).unwrap().reply, Some((_, 0, Err(CallError::Reset)))), "its call ends");
            assert!(inbox.waiting(2).unwrap().reply.is_none(), "the other connection's call waits on");
        }
        // What A sends on it before hearing of the close is reset unread; the new connection is read.
        tell_on(&net, A, B, old, 3);
        tell_on(&net, A, B, new, 4);
        sleep_until(now + 20_000_000).await;
        assert_eq!(requests_read(&net, B), [4]);
    });
}

#[test]
fn a_cut_holds_a_servers_close_as_it_holds_data() {
    in_world_async(|net| async move {
        let a = rpc_a(&net);
        let socket = a.open(B);
        tell_on(&net, A, B, socket, 1);
        net.cut(B, A, true);
        let Socket(n) = socket;
        Rpc::bind(&net, &Clock::default(), B, 0).close_connection(Connection { peer: A, socket: n });
        sleep_until(2_000_000_000).await;
        assert!(net.state().inboxes[&A].closed.is_empty(), "held in B's kernel");
        net.cut(B, A, false);
        let closed = net.state().inboxes[&A].closed.clone();
        // Sent at 0: retransmitted at 0.2, 0.4, 0.8, 1.6, 3.2 s — the first after the heal at 2 s.
        let [(at, ..)] = closed[..] else { panic!("one close: {closed:?}") };
        assert!((3_200_000_000 + LATENCY_NS.0..=3_200_000_000 + LATENCY_NS.1).contains(&at), "{at}");
    });
}
