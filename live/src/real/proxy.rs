//! Loopback TCP proxies: one per client, between its process and the server, through which the
//! network faults act. A proxy listens on `127.0.0.1:0`; the client's `LOCKSIM_REDIS` (or
//! `LOCKSIM_ZOOKEEPER`) names it; each connection it accepts gets one to the server, and bytes are
//! pumped both ways (`Up`: client → server, `Down`: server → client), each way by a reader thread that
//! stamps every chunk with when it may be delivered and a writer thread that delivers the chunks in
//! order at that time — so a chunk never overtakes another, as on one TCP connection.
//!
//! What a [`Link`] (the faults' handle on one client's path) does to the bytes, with the simulator's
//! meaning (`sim/src/net.rs`):
//! - **cut** (`partition` both ways, `clog` one way): bytes read from a cut direction are *held* and
//!   delivered after the heal, at the first TCP retransmission after it (Linux: 200 ms, doubling up to
//!   120 s, given up after `tcp_retries2` = 15, about 924 s — [`retransmission_after`], the
//!   simulator's rule). That, and not dropping, is what a real partition does to a live connection
//!   on Linux: the sender's kernel keeps unacknowledged data and retransmits it, so it arrives late
//!   and the application sees no loss unless the partition outlasts the retransmissions — then the
//!   connection is broken, as here. The reader stops reading while it holds, so the rest waits in the
//!   kernel's buffers (bounded by them, and by the client's flow control). Two differences remain:
//!   the client's kernel gets its data acknowledged (by the proxy's) and its keep-alive probes
//!   answered, and a new connection is accepted at once — though nothing passes on it until its SYN
//!   would have got through, at the first SYN retransmission after the heal (1, 3, 7, 15 … s after the
//!   dial: `handshake`); the adapters here notice a partition by their own timeouts, not by TCP
//!   keep-alive.
//! - **delay**: each chunk is delivered `latency` after it was read (the client's and the server's
//!   delays add, as the simulator adds the sender's and the receiver's).
//! - **drop-reply** (at `rate`): a chunk from the server is lost — which TCP cannot do without
//!   breaking the connection, so the connection is broken: the client gets a reset (`SO_LINGER` 0)
//!   after its request went through and was applied, and the server's side is closed.
//!
//! The server ending a connection (a crash closes its sockets) is passed on as an end of stream, an
//! error as a reset; a connection the server refuses (it is down) is reset at once. Every thread polls
//! the run's end every [`POLL`], so dropping a [`Proxy`] joins them all and closes every socket.

use locksim_sim::net::{retransmission_after, syn_retransmission_after};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a waiting thread looks whether the run (or its connection) is over.
pub const POLL: Duration = Duration::from_millis(50);
/// Connections one proxy keeps at once per link; past it a new one is reset (a client that leaks connections).
const CONNECTIONS_MAX: usize = 64;
/// Chunks in flight one way on one connection; a full queue stops the reader (TCP flow control).
const CHUNKS_MAX: usize = 256;
const CHUNK_BYTES: usize = 16 * 1024;

/// A direction on a client's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client → server: requests.
    Up,
    /// Server → client: replies (and the server's pushes).
    Down,
}

/// Whose delay: a node's `delay` slows everything to and from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// What the faults have set on one client's path to the server, shared by all its connections.
pub struct Link {
    state: Mutex<LinkState>,
    changed: Condvar,
    /// Connections open to the server through it now.
    open: AtomicUsize,
}

struct LinkState {
    /// Faults cutting each direction now (`[Up, Down]`).
    cuts: [u32; 2],
    /// The client's and the server's extra latency (`[Client, Server]`).
    delays: [Duration; 2],
    /// The server's replies are lost at this rate (a `drop-reply` fault on the server).
    drop_reply: Option<f64>,
    /// Draws whether a reply is lost.
    rng: ChaCha8Rng,
    /// The run is over: every thread ends.
    stopped: bool,
}

/// When a chunk read now may be delivered, or that its connection breaks.
enum Admit {
    At(Instant),
    Break,
}

impl Link {
    fn new(rng: ChaCha8Rng) -> Link {
        let state = LinkState { cuts: [0; 2], delays: [Duration::ZERO; 2], drop_reply: None, rng, stopped: false };
        Link { state: Mutex::new(state), changed: Condvar::new(), open: AtomicUsize::new(0) }
    }

    /// Whether a connection to the server is open through it now (which server a client's session is on).
    pub fn connected(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    fn state(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().expect("link lock")
    }

    /// Cut (`on`) or heal one cut of `dir`; bytes held by the cut go on once no cut is left.
    pub fn cut(&self, dir: Dir, on: bool) {
        let mut s = self.state();
        let n = &mut s.cuts[dir as usize];
        *n = if on { *n + 1 } else { n.saturating_sub(1) };
        self.changed.notify_all();
    }

    /// `side`'s extra latency each way (`None` clears it), for chunks read from now on.
    pub fn set_delay(&self, side: Side, latency: Option<Duration>) {
        self.state().delays[side as usize] = latency.unwrap_or_default();
    }

    /// Lose each reply of the server at `rate`, breaking its connection (`None` clears it).
    pub fn set_drop_reply(&self, rate: Option<f64>) {
        self.state().drop_reply = rate;
    }

    fn stop(&self) {
        self.state().stopped = true;
        self.changed.notify_all();
    }

    fn stopped(&self) -> bool {
        self.state().stopped
    }

    /// The fate of a chunk read from `dir` at `read_at`; while `dir` is cut, wait for the heal.
    fn admit(&self, dir: Dir, read_at: Instant, conn: &Conn) -> Admit {
        let mut s = self.state();
        if dir == Dir::Down {
            if let Some(rate) = s.drop_reply {
                if rate > 0.0 && s.rng.gen_bool(rate.min(1.0)) {
                    return Admit::Break;
                }
            }
        }
        let mut sent_at = read_at;
        if s.cuts[dir as usize] > 0 {
            while s.cuts[dir as usize] > 0 {
                if s.stopped || conn.broken() {
                    return Admit::Break;
                }
                s = self.changed.wait_timeout(s, POLL).expect("link lock").0;
            }
            let held_ns = read_at.elapsed().as_nanos() as u64;
            match retransmission_after(0, held_ns) {
                Some(ns) => sent_at = read_at + Duration::from_nanos(ns),
                // The sender's kernel gave the connection up before the heal.
                None => return Admit::Break,
            }
        }
        Admit::At(sent_at + s.delays[0] + s.delays[1])
    }
}

/// A proxy in front of the server for one client (or one link per source, [`Proxy::by_source`]);
/// dropping it ends every connection and thread.
pub struct Proxy {
    addr: SocketAddr,
    links: Vec<Arc<Link>>,
    accept: Option<JoinHandle<()>>,
}

/// Which of a proxy's links a connection it accepted takes: its source's, `None` for a stranger.
pub type Source = Arc<dyn Fn(&TcpStream) -> Option<usize> + Send + Sync>;

/// Where a proxy sends the connections it accepts.
#[derive(Clone)]
enum Route {
    /// Nowhere: every connection is reset.
    Refuse,
    /// To `server`, over the proxy's one link.
    To(SocketAddr),
    /// To `server`, over the link of the connection's source; a stranger's connection is reset.
    BySource(SocketAddr, Source),
}

impl Proxy {
    /// Listen on a free loopback port and forward every connection to `server`; `rng` draws the lost
    /// replies.
    pub fn start(server: SocketAddr, rng: ChaCha8Rng) -> anyhow::Result<Proxy> {
        Proxy::listen(Route::To(server), vec![rng])
    }

    /// Listen on a free loopback port and reset every connection: a dial that must not go through.
    pub fn refusing(rng: ChaCha8Rng) -> anyhow::Result<Proxy> {
        Proxy::listen(Route::Refuse, vec![rng])
    }

    /// Listen on a free loopback port and forward every connection to `server` over a link of its
    /// source's, as `source` tells it (one link per rng of `rngs`): a server that many peers reach at
    /// one address, each of whose paths a fault may cut alone. A connection whose source is unknown is
    /// reset, so that no cut is ever gone round.
    pub fn by_source(server: SocketAddr, rngs: Vec<ChaCha8Rng>, source: Source) -> anyhow::Result<Proxy> {
        Proxy::listen(Route::BySource(server, source), rngs)
    }

    fn listen(route: Route, rngs: Vec<ChaCha8Rng>) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let links: Vec<Arc<Link>> = rngs.into_iter().map(|rng| Arc::new(Link::new(rng))).collect();
        let shared = links.clone();
        let accept = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || accept_loop(&listener, &route, &shared))?;
        Ok(Proxy { addr, links, accept: Some(accept) })
    }

    /// Where the client connects.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its link (the first source's, for a proxy [`Proxy::by_source`]).
    pub fn link(&self) -> &Link {
        &self.links[0]
    }

    /// The link of connections from `source` ([`Proxy::by_source`]).
    pub fn link_from(&self, source: usize) -> &Link {
        &self.links[source]
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.links.iter().for_each(|l| l.stop());
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Accept connections until the links stop, each served on a thread of its own (or reset at once, by a
/// refusing proxy); then join them.
fn accept_loop(listener: &TcpListener, route: &Route, links: &[Arc<Link>]) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !links[0].stopped() {
        if !readable(listener.as_raw_fd()) {
            continue;
        }
        let Ok((client, _)) = listener.accept() else { continue };
        conns.retain(|c| !c.is_finished());
        let server = match route {
            Route::Refuse => {
                reset(&client);
                continue;
            }
            Route::To(server) | Route::BySource(server, _) => *server,
        };
        if conns.len() >= CONNECTIONS_MAX * links.len() || client.set_nonblocking(false).is_err() {
            reset(&client);
            continue;
        }
        let (route, links) = (route.clone(), links.to_vec());
        let serving = move || {
            // The source is looked up here, not in the accept loop: it reads /proc.
            let link = match &route {
                Route::BySource(_, source) => match source(&client).and_then(|i| links.get(i)) {
                    Some(link) => link,
                    None => return reset(&client),
                },
                _ => &links[0],
            };
            serve(client, server, link)
        };
        match std::thread::Builder::new().name("proxy-conn".into()).spawn(serving) {
            Ok(handle) => conns.push(handle),
            // The client's end is dropped with the closure: it sees the connection end.
            Err(_) => continue,
        }
    }
    conns.into_iter().for_each(|c| drop(c.join()));
}

/// Whether `fd` has a connection to accept, waiting at most [`POLL`].
fn readable(fd: i32) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: poll(2) on one valid pollfd that lives across the call.
    unsafe { libc::poll(&mut pfd, 1, POLL.as_millis() as i32) > 0 }
}

/// One client connection and its connection to the server.
struct Conn {
    /// Broken (a lost reply, a reset, retransmissions given up): every pump ends, the client is reset.
    broken: AtomicBool,
}

impl Conn {
    fn broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    fn breaks(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    fn over(&self, link: &Link) -> bool {
        self.broken() || link.stopped()
    }
}

/// What a reader hands its writer.
enum Piece {
    Bytes(Instant, Vec<u8>),
    /// The sender closed its side: pass the end of stream on.
    End,
}

fn serve(client: TcpStream, server: SocketAddr, link: &Link) {
    let conn = Conn { broken: AtomicBool::new(false) };
    if !handshake(link, Instant::now(), &conn) {
        return reset(&client);
    }
    let Ok(upstream) = TcpStream::connect(server) else {
        // The server is down: its host would refuse; the client's connection to the proxy is reset.
        return reset(&client);
    };
    link.open.fetch_add(1, Ordering::Relaxed);
    let _open = Open(&link.open);
    let handles = (client.try_clone(), client.try_clone(), upstream.try_clone());
    let (Ok(client_w), Ok(client_kept), Ok(upstream_w)) = handles else { return reset(&client) };
    for s in [&client, &upstream, &client_w, &upstream_w] {
        // Timeouts so that every blocked read and write looks at the run's end now and then.
        let _ = s.set_read_timeout(Some(POLL)).and_then(|()| s.set_write_timeout(Some(POLL)));
        let _ = s.set_nodelay(true);
    }
    std::thread::scope(|scope| {
        let conn = &conn;
        let (up_tx, up_rx) = sync_channel(CHUNKS_MAX);
        let (down_tx, down_rx) = sync_channel(CHUNKS_MAX);
        scope.spawn(move || read(client, Dir::Up, &up_tx, link, conn));
        scope.spawn(move || write(upstream_w, &up_rx, link, conn));
        scope.spawn(move || read(upstream, Dir::Down, &down_tx, link, conn));
        write(client_w, &down_rx, link, conn);
    });
    // Every other handle is closed: this last one resets a broken connection as it closes.
    if conn.broken() {
        reset(&client_kept);
    }
}

/// A connection dialled while its link is cut (either way) gets through only after the heal: its SYN
/// (or the answer) is lost, and the client's kernel sends it again 1, 3, 7, 15 … s after the dial
/// ([`syn_retransmission_after`], the simulator's rule), giving up after `tcp_syn_retries`. Meanwhile
/// nothing passes either way (what the client sends waits in its kernel's buffer). False: the dial
/// failed, or the run ended.
fn handshake(link: &Link, dialled: Instant, conn: &Conn) -> bool {
    let mut s = link.state();
    if s.cuts == [0, 0] {
        return true;
    }
    while s.cuts != [0, 0] {
        if s.stopped {
            return false;
        }
        s = link.changed.wait_timeout(s, POLL).expect("link lock").0;
    }
    drop(s);
    match syn_retransmission_after(0, dialled.elapsed().as_nanos() as u64) {
        Some(ns) => sleep_until(dialled + Duration::from_nanos(ns), link, conn),
        None => false,
    }
}

/// Counts a connection open until it is dropped.
struct Open<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Read chunks from `from` (the `dir` side's sender) and hand them on, stamped, until it ends.
fn read(mut from: TcpStream, dir: Dir, to: &SyncSender<Piece>, link: &Link, conn: &Conn) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    while !conn.over(link) {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.send(Piece::End);
                return;
            }
            Ok(n) => {
                let Admit::At(at) = link.admit(dir, Instant::now(), conn) else { return conn.breaks() };
                if to.send(Piece::Bytes(at, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            // A reset from either end is passed on as one.
            Err(_) => return conn.breaks(),
        }
    }
}

/// Write the chunks, in order and each at its time, to `to` until its reader ends.
fn write(mut to: TcpStream, from: &Receiver<Piece>, link: &Link, conn: &Conn) {
    loop {
        match from.recv_timeout(POLL) {
            Ok(Piece::Bytes(at, bytes)) => {
                if !sleep_until(at, link, conn) || !write_all(&mut to, &bytes, link, conn) {
                    return conn.breaks();
                }
            }
            Ok(Piece::End) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Err(RecvTimeoutError::Timeout) if !conn.over(link) => {}
            Err(_) => return,
        }
    }
}

/// Sleep until `at`; false if the connection or run ended first.
fn sleep_until(at: Instant, link: &Link, conn: &Conn) -> bool {
    loop {
        if conn.over(link) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(POLL));
    }
}

fn write_all(to: &mut TcpStream, mut bytes: &[u8], link: &Link, conn: &Conn) -> bool {
    while !bytes.is_empty() {
        if conn.over(link) {
            return false;
        }
        match to.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return false,
        }
    }
    true
}

/// Reset `stream` when it is closed (`SO_LINGER` with a zero timeout: the close sends a reset, not an
/// end of stream) — now, if this is its last handle.
fn reset(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt(2) on an open socket with a pointer to a linger that lives across the call.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locksim_sim::rng::{stream, Stream};

    /// An echo server on loopback (one thread per connection), and a proxy in front of it.
    fn echo_and_proxy() -> (Proxy, SocketAddr) {
        let addr = echo_server();
        (Proxy::start(addr, stream(0, Stream::Network, 0)).unwrap(), addr)
    }

    /// An echo server on loopback, one thread per connection.
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = conn.read(&mut buf) {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn connect(proxy: &Proxy) -> TcpStream {
        let open = || proxy.link().open.load(Ordering::Relaxed);
        let before = open();
        let conn = TcpStream::connect(proxy.addr()).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Through its handshake (a connection dialled into a cut is another test's) before the test
        // cuts anything, unless the proxy does not serve it.
        let dialled = Instant::now();
        while open() == before && dialled.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(1));
        }
        conn
    }

    #[test]
    fn a_connection_dialled_into_a_cut_passes_nothing_until_its_syn_is_sent_again_after_the_heal() {
        let (proxy, _) = echo_and_proxy();
        proxy.link().cut(Dir::Up, true);
        let dialled = Instant::now();
        let mut conn = TcpStream::connect(proxy.addr()).unwrap();
        conn.write_all(b"held").unwrap();
        std::thread::sleep(Duration::from_millis(400));
        proxy.link().cut(Dir::Up, false);
        // Healed at 0.4 s: the SYN sent again 1 s after the dial gets through, then the bytes.
        let mut buf = [0u8; 4];
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"held");
        let after = dialled.elapsed();
        assert!(after >= Duration::from_millis(1000) && after < Duration::from_millis(1400), "{after:?}");
    }

    /// Send `text` and read as many bytes back, returning them and how long it took.
    fn echo(conn: &mut TcpStream, text: &[u8]) -> (Vec<u8>, Duration) {
        let t = Instant::now();
        conn.write_all(text).unwrap();
        let mut back = vec![0u8; text.len()];
        conn.read_exact(&mut back).unwrap();
        (back, t.elapsed())
    }

    #[test]
    fn bytes_go_both_ways_through_the_proxy() {
        let (proxy, _) = echo_and_proxy();
        let mut conn = connect(&proxy);
        for text in [&b"PING\r\n"[..], &[7u8; 100_000][..]] {
            assert_eq!(echo(&mut conn, text).0, text);
        }
    }

    #[test]
    fn a_partition_holds_the_bytes_and_delivers_them_at_the_retransmission_after_the_heal() {
        let (proxy, _) = echo_and_proxy();
        let mut conn = connect(&proxy);
        proxy.link().cut(Dir::Up, true);
        proxy.link().cut(Dir::Down, true);
        conn.write_all(b"held").unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 4];
        let err = conn.read(&mut buf).expect_err("nothing gets through a partition");
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err}");
        // Healed 0.3 s after the first held byte: a loss probe at 0.2 s, a retransmission at 0.4 s.
        let healed = Instant::now();
        proxy.link().cut(Dir::Up, false);
        proxy.link().cut(Dir::Down, false);
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"held");
        let after = healed.elapsed();
        assert!(after >= Duration::from_millis(50) && after < Duration::from_millis(300), "{after:?}");
        // The connection is alive and quick again.
        assert!(echo(&mut conn, b"again").1 < Duration::from_millis(100));
    }

    #[test]
    fn a_clog_holds_one_way_only() {
        let (proxy, _) = echo_and_proxy();
        let mut conn = connect(&proxy);
        // The server's outgoing bytes are held: the request arrives, the echo does not.
        proxy.link().cut(Dir::Down, true);
        conn.write_all(b"x").unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(250))).unwrap();
        assert!(conn.read(&mut [0u8; 1]).is_err(), "the reply is held");
        proxy.link().cut(Dir::Down, false);
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1];
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"x");
    }

    #[test]
    fn a_delay_adds_latency_each_way() {
        let (proxy, _) = echo_and_proxy();
        let mut conn = connect(&proxy);
        proxy.link().set_delay(Side::Client, Some(Duration::from_millis(100)));
        let took = echo(&mut conn, b"slow").1;
        assert!(took >= Duration::from_millis(200) && took < Duration::from_millis(400), "{took:?}");
        proxy.link().set_delay(Side::Client, None);
        assert!(echo(&mut conn, b"fast").1 < Duration::from_millis(100));
    }

    #[test]
    fn a_dropped_reply_resets_the_connection_after_the_request_went_through() {
        let (proxy, _) = echo_and_proxy();
        let mut conn = connect(&proxy);
        proxy.link().set_drop_reply(Some(1.0));
        conn.write_all(b"applied").unwrap();
        let err = conn.read(&mut [0u8; 16]).expect_err("the connection is reset");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    }

    #[test]
    fn a_dropped_proxy_leaves_no_listener_and_ends_its_connections() {
        let (proxy, _) = echo_and_proxy();
        let addr = proxy.addr();
        let mut conn = connect(&proxy);
        proxy.link().cut(Dir::Up, true);
        conn.write_all(b"held when the run ends").unwrap();
        // Drop joins every thread, a held one included.
        let t = Instant::now();
        drop(proxy);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(TcpStream::connect(addr).is_err(), "nothing listens on {addr} any more");
        let mut buf = [0u8; 1];
        assert!(matches!(conn.read(&mut buf), Ok(0) | Err(_)), "the client's connection ended");
    }

    #[test]
    fn a_proxy_knows_whether_a_connection_is_open_through_it() {
        let (proxy, _) = echo_and_proxy();
        assert!(!proxy.link().connected());
        let mut conn = connect(&proxy);
        echo(&mut conn, b"up");
        assert!(proxy.link().connected());
        drop(conn);
        let t = Instant::now();
        while proxy.link().connected() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!proxy.link().connected(), "the closed connection is no longer counted");
    }

    #[test]
    fn a_refusing_proxy_resets_every_connection() {
        let proxy = Proxy::refusing(stream(0, Stream::Network, 0)).unwrap();
        let mut conn = connect(&proxy);
        let err = conn.read(&mut [0u8; 1]).expect_err("reset");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    }

    #[test]
    fn a_connection_to_a_server_that_is_down_is_reset() {
        let port = TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap();
        let proxy = Proxy::start(port, stream(0, Stream::Network, 0)).unwrap();
        let mut conn = connect(&proxy);
        let err = conn.read(&mut [0u8; 1]).expect_err("reset");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    }

    #[test]
    fn a_proxy_by_source_cuts_one_sources_path_and_resets_strangers() {
        // The source is the first byte a connection sends (a peer's process, in a cluster).
        let source: Source = Arc::new(|conn: &TcpStream| {
            let mut first = [0u8; 1];
            conn.peek(&mut first).ok()?;
            char::from(first[0]).to_digit(10).map(|d| d as usize)
        });
        let rngs = (0..2).map(|i| stream(0, Stream::Network, i)).collect();
        let proxy = Proxy::by_source(echo_server(), rngs, source).unwrap();
        proxy.link_from(1).cut(Dir::Up, true);
        let (mut zero, mut one) = (connect(&proxy), connect(&proxy));
        assert_eq!(echo(&mut zero, b"0 passes").0, b"0 passes");
        one.write_all(b"1 is held").unwrap();
        one.set_read_timeout(Some(Duration::from_millis(250))).unwrap();
        assert!(one.read(&mut [0u8; 1]).is_err(), "source 1's path is cut");
        proxy.link_from(1).cut(Dir::Up, false);
        one.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut back = [0u8; 9];
        one.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"1 is held");
        let mut stranger = connect(&proxy);
        stranger.write_all(b"x").unwrap();
        let err = stranger.read(&mut [0u8; 1]).expect_err("reset");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    }
}
