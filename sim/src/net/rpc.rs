//! One node's endpoint on the network ([`Rpc`]): the calls it makes, the requests and stream messages
//! it serves, its sockets, and the TCP keep-alive probes its client libraries send.

use super::*;

/// The fate of a TCP keep-alive probe (see [`Rpc::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The peer's kernel acknowledged it: the connection is alive.
    Acked,
    /// The peer's host restarted: its kernel resets the connection.
    Reset,
    /// Nothing came back (a cut link, a host that is down).
    Unanswered,
    /// Data to the peer is unacknowledged: no probe is sent; `gave_up` once the retransmissions have
    /// run out.
    Retransmitting { gave_up: bool },
}

/// A call on its way: it stops waiting when it returns or is dropped (a caller that gave up on it in a
/// `select!`), so neither its reply nor the deadline timer wakes the caller for it afterwards.
struct Pending<'a> {
    rpc: &'a Rpc,
    tag: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut s = self.rpc.net.state();
        if let Some(inbox) = s.inboxes.get_mut(&self.rpc.me) {
            inbox.stop_waiting(self.tag);
        }
    }
}

/// What reaches a node's reader ([`Rpc::next_input`]).
pub enum Input<Q> {
    /// A request or stream message, and where its answer goes.
    Request(ReplyTo, Q),
    /// `peer` closed its connection on `socket` to this node ([`Rpc::close_connection`]), or life
    /// `life` of its process died and its kernel closed them all (`socket` `None`); the close arrived
    /// at `arrived_ns` (earlier than now if this node was paused).
    Closed { peer: NodeIx, life: u32, socket: Option<Socket>, arrived_ns: u64 },
}

/// One node's endpoint for this life of the node: it makes calls and serves them. Clones share it.
#[derive(Clone)]
pub struct Rpc {
    me: NodeIx,
    incarnation: u32,
    net: Net,
    clock: Clock,
    next_tag: Rc<Cell<u64>>,
}

impl Rpc {
    /// The endpoint of `me`'s life `incarnation` on `net`: the world opened it when it started the node
    /// ([`Net::bind_host`]); a node built outside a world gets one here. Nodes call it through
    /// [`NodeEnv::rpc`](crate::world::NodeEnv::rpc).
    pub fn bind(net: &Net, clock: &Clock, me: NodeIx, incarnation: u32) -> Rpc {
        let opened = net.state().inboxes.get(&me).is_some_and(|i| i.incarnation == incarnation);
        if !opened {
            net.bind_host(me, incarnation);
        }
        // Reply tags are unique across lives: a late reply to a call of a previous life must not be
        // taken for the answer to a call of this one.
        let first_tag = (u64::from(incarnation) << 40) + 1;
        Rpc { me, incarnation, net: net.clone(), clock: clock.clone(), next_tag: Rc::new(Cell::new(first_tag)) }
    }

    pub fn me(&self) -> NodeIx {
        self.me
    }

    /// Which life of this node the endpoint belongs to (0 until its first restart).
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// What this node's kernel finds on its connection to life `incarnation` of `peer` if it sends a
    /// keep-alive probe now. A paused process's kernel answers; a crashed host does not; a restarted
    /// one answers with a reset (it knows nothing of the old connection). While data sent to the peer
    /// waits for a retransmission, the kernel sends no probes (Linux `tcp_keepalive_timer` leaves the
    /// connection to the retransmission timer, which gives up after `tcp_retries2`).
    pub fn probe(&self, peer: NodeIx, incarnation: u32) -> Probe {
        let s = self.net.state();
        let socket = s.sockets.current(self.me, peer);
        let conn = Conn { from: self.me, to: peer, from_life: self.incarnation, to_life: incarnation, socket };
        if let Some(held) = s.held.get(&conn) {
            let gave_up = held.through_after(sim_now_ns()).is_none();
            return Probe::Retransmitting { gave_up };
        }
        if s.cuts.contains_key(&(self.me, peer)) || s.cuts.contains_key(&(peer, self.me)) {
            return Probe::Unanswered;
        }
        match s.inboxes.get(&peer) {
            None => Probe::Unanswered,
            Some(inbox) if inbox.incarnation != incarnation || inbox.process_dead => Probe::Reset,
            Some(_) => Probe::Acked,
        }
    }

    /// When the data this node last sent to life `incarnation` of `peer` reached it, if it has by now
    /// (sim ns): the peer's kernel acknowledged it then. Linux counts an ACK as hearing from the peer:
    /// `tcp_ack` sets `rcv_tstamp` and clears `icsk_probes_out`, and `keepalive_time_elapsed` counts the
    /// idle time from the later of the last data (`icsk_ack.lrcvtime`) and the last ACK received. (The
    /// ACK's own way back, a few milliseconds, is not counted.)
    pub fn acked_ns(&self, peer: NodeIx, incarnation: u32) -> Option<u64> {
        let s = self.net.state();
        let (life, at) = *s.acked.get(&(self.me, peer))?;
        (life == incarnation && at <= sim_now_ns()).then_some(at)
    }

    /// Open a new connection to `to` (`socket`, `connect`), for [`Rpc::call_on`]: its first data
    /// waits for its handshake — sent into a cut, it goes at the first SYN retransmission after the
    /// heal (1, 3, 7, 15, 31, 63 s after the SYN; given up at 127 s: `tcp_syn_retries`), not on data's
    /// 200 ms schedule — and nothing another socket holds delays it.
    pub fn open(&self, to: NodeIx) -> Socket {
        self.net.state().open(self.me, to)
    }

    /// Close `socket`, opened to `to`, as Linux's `tcp_close` does: unacknowledged data stays in the
    /// kernel, an orphan retransmitting `TCP_ORPHAN_RETRIES` times, and may still reach the peer after
    /// a heal; a socket whose handshake never got through (`SYN_SENT`) is gone, and its data with it —
    /// an abandoned connect is never delivered.
    pub fn close(&self, to: NodeIx, socket: Socket) {
        self.net.state().close(self.me, to, socket);
    }

    /// Close the connection this node last opened to `to` (the pair's shared one if none, socket 0)
    /// as [`Rpc::close`] does, and open a new one, on which what it then sends without a socket of its
    /// own goes: a client that drops a connection it gave up on and dials again (a Redis Sentinel's
    /// link to an instance, `instanceLinkCloseConnection` then `sentinelReconnectInstance`).
    pub fn reconnect(&self, to: NodeIx) {
        let mut s = self.net.state();
        let old = s.newest_socket(self.me, to);
        s.close(self.me, to, old);
        s.open(self.me, to);
    }

    /// A server closes a client's connection (ZooKeeper's `ServerCnxn.close`: an expired session's,
    /// a shut-down server's): its kernel sends a FIN behind what the server already sent on it, one
    /// network delay away (held by a cut, as data is; its latency from the kernel's stream, so a run
    /// that closes none draws what it drew before). The client reads the end of its stream
    /// ([`Input::Closed`] with the socket), and its calls still waiting on the connection end as
    /// [`CallError::Reset`]; what it sends on it meanwhile is reset unread.
    pub fn close_connection(&self, connection: Connection) {
        let mut s = self.net.state();
        if s.inboxes.get(&self.me).is_none_or(|i| i.process_dead) {
            return;
        }
        let (peer, socket) = (connection.peer, connection.socket);
        s.sockets.shut.insert((self.me, peer, socket));
        let msg = Message::Closed { life: self.incarnation, socket: Some(socket) };
        let now = sim_now_ns();
        match s.conn(self.me, peer, socket) {
            Some(conn) if s.holds(&conn) => s.hold(conn, msg, now),
            Some(_) => s.deliver(self.me, peer, socket, msg, now),
            // The client's host is down: nothing to close.
            None => {}
        }
    }

    /// Send `req` to `to` and wait for its reply, at most `timeout` by this node's clock.
    pub async fn call<Q, R>(&self, to: NodeIx, req: Q, timeout: Duration) -> Result<R, CallError>
    where
        Q: Any + Send,
        R: Any + Send,
    {
        self.call_on(to, None, None, req, timeout).await.map(|(reply, _)| reply)
    }

    /// [`Rpc::call`] on a connection: `socket` is the one the caller opened ([`Rpc::open`]; `None`: the
    /// pair's shared connection), `conn` the life of `to` that the connection was opened with (`None`:
    /// open one now). The reply comes with the life that answered, which the caller keeps
    /// as its connection. A request on a connection to an earlier life is refused with
    /// [`CallError::Reset`] — a restarted host resets connections it does not know — and is not
    /// applied: that is how a client library learns that its server restarted, and reconnects.
    pub async fn call_on<Q, R>(
        &self,
        to: NodeIx,
        socket: Option<Socket>,
        conn: Option<u32>,
        req: Q,
        timeout: Duration,
    ) -> Result<(R, u32), CallError>
    where
        Q: Any + Send,
        R: Any + Send,
    {
        let tag = self.next_tag.get();
        self.next_tag.set(tag + 1);
        // madsim's timers wait at least 1 ms.
        let now = sim_now_ns();
        let deadline_ns = now + self.clock.real_duration(timeout).max(Duration::from_millis(1)).as_nanos() as u64;
        {
            let mut s = self.net.state();
            let socket = socket.map_or_else(|| s.sockets.current(self.me, to), |Socket(s)| s);
            let waiting = Waiting { peer: to, socket, reply: None, caller: None, deadline_ns };
            match s.inboxes.get_mut(&self.me) {
                Some(inbox) => inbox.waiting.push((tag, waiting)),
                None => return Err(CallError::Timeout),
            };
            s.send(self.me, to, socket, Message::Request { reply_tag: tag, body: Box::new(req), conn }, now);
        }
        let _pending = Pending { rpc: self, tag };
        // The reply once it has arrived, or `None` once the deadline has passed (a reply that arrives
        // at the deadline wins). A node that died meanwhile waits for ever (its tasks are being
        // dropped).
        let reply = std::future::poll_fn(|cx| {
            let mut s = self.net.state();
            let Some(inbox) = s.inboxes.get_mut(&self.me) else { return Poll::Pending };
            let now = sim_now_ns();
            let waiting = inbox.waiting(tag).expect("a call waits until it returns");
            if waiting.reply.as_ref().is_some_and(|(arrive_ns, ..)| *arrive_ns <= now) {
                let (_, life, body) = waiting.reply.take().expect("just seen");
                return Poll::Ready(Some((life, body)));
            }
            if deadline_ns <= now {
                s.call_timeouts += 1;
                return Poll::Ready(None);
            }
            if !waiting.caller.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                waiting.caller = Some(cx.waker().clone());
            }
            if inbox.deadline_timer_ns.is_none_or(|at| at > deadline_ns) {
                inbox.watch(now);
            }
            Poll::Pending
        })
        .await;
        match reply {
            Some((life, Ok(body))) => Ok((*body.downcast::<R>().expect("reply type matches the request type"), life)),
            Some((_, Err(e))) => Err(e),
            None => Err(CallError::Timeout),
        }
    }

    /// Send `msg` to `to` without waiting for anything (replication streams).
    pub fn tell<Q: Any + Send>(&self, to: NodeIx, msg: Q) {
        self.tell_boxed(to, Box::new(msg));
    }

    /// [`Rpc::tell`] for a message already boxed.
    pub fn tell_boxed(&self, to: NodeIx, msg: Payload) {
        self.net.send(self.me, to, Message::Request { reply_tag: 0, body: msg, conn: None });
    }

    /// The next request for this node, once it has arrived. Panics if a node receives a request type it
    /// does not serve.
    /// One task per node reads its requests (its server loop, or a client's listener): each request
    /// wakes it when it arrives.
    pub async fn next_request<Q: Any + Send>(&self) -> (ReplyTo, Q) {
        std::future::poll_fn(|cx| {
            let mut s = self.net.state();
            let s = &mut *s;
            let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
            match inbox.take_request(self.me, sim_now_ns(), &s.sockets) {
                Some((reply_to, body)) => Poll::Ready((reply_to, downcast_request(body))),
                None => {
                    inbox.reader.set(cx.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// The next request for this node, or the next connection a peer's kernel closed (a killed
    /// process's, see [`Net::kill_process`]), whichever arrives first; closes first at one instant.
    /// One task per node reads its input, as with [`Rpc::next_request`].
    pub async fn next_input<Q: Any + Send>(&self) -> Input<Q> {
        match self.next_input_any().await {
            Input::Request(reply_to, body) => Input::Request(reply_to, downcast_request(body)),
            Input::Closed { peer, life, socket, arrived_ns } => Input::Closed { peer, life, socket, arrived_ns },
        }
    }

    /// [`Rpc::next_input`] for a node that reads messages of several types (an ensemble member: its
    /// clients' requests and its peers' messages), each still boxed.
    pub async fn next_input_any(&self) -> Input<Payload> {
        std::future::poll_fn(|cx| match self.arrived_input() {
            Some(input) => Poll::Ready(input),
            None => {
                let mut s = self.net.state();
                let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
                inbox.reader.set(cx.waker());
                Poll::Pending
            }
        })
        .await
    }

    /// The next input that has arrived by now, if any, without waiting: with
    /// [`Rpc::next_input_any`], what has piled up for a process that was paused.
    pub fn arrived_input(&self) -> Option<Input<Payload>> {
        let mut s = self.net.state();
        let s = &mut *s;
        let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
        let now = sim_now_ns();
        if let Some(i) = (0..inbox.closed.len()).filter(|i| inbox.closed[*i].0 <= now).min_by_key(|i| inbox.closed[*i])
        {
            let (arrived_ns, peer, life, socket) = inbox.closed.remove(i);
            return Some(Input::Closed { peer, life, socket: socket.map(Socket), arrived_ns });
        }
        inbox.take_request(self.me, now, &s.sockets).map(|(reply_to, body)| Input::Request(reply_to, body))
    }

    /// Answer a request (nothing is sent for one-way messages).
    pub fn reply<R: Any + Send>(&self, to: &ReplyTo, reply: R) {
        if to.reply_tag != 0 {
            let reply = Message::Reply { tag: to.reply_tag, body: Ok(Box::new(reply)), life: self.incarnation };
            self.net.state().send(self.me, to.from, to.socket, reply, sim_now_ns());
        }
    }
}
