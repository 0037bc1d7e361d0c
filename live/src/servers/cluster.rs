//! A cluster of real servers on loopback: a ZooKeeper ensemble, an etcd cluster, a Redis master with
//! its replicas and three Sentinels. Every member is started at once (none answers before a quorum is
//! up), each in its own temporary directory, and stopped with the cluster.
//!
//! **Peer links through proxies** ([`Launcher::peer_links`]), so that [`Cluster::cut`] can hold the
//! bytes between two members, as a partition does, while their clients still reach both:
//!
//! - **A proxy per pair** (ZooKeeper): each member reaches each other member through a proxy of its
//!   own ([`crate::real::proxy`]) — its zoo.cfg names the proxy's port for that member. ZooKeeper keeps
//!   one election connection per pair of servers, the one the higher id opens: when the lower id dials,
//!   the higher one drops the connection and dials back to the address the lower one announced
//!   (`QuorumCnxManager.handleConnection`), which would go round the proxy. So the proxy from a lower
//!   id to a higher one refuses every connection, and the pair's election connection is always the
//!   higher id's, through its proxy. The quorum connection is always the follower's, to its leader's
//!   quorum port through its proxy.
//! - **A proxy per member** (etcd): etcd's member ids are a hash of the peer URLs of the initial
//!   cluster, which every member must list alike, so a member cannot reach another at an address of
//!   its own. Each member listens on its peer port and announces its proxy's
//!   (`--initial-advertise-peer-urls`), and the proxy tells each connection's source by the process
//!   that holds its other end ([`crate::process::connected_from`]): the member whose working
//!   directory is that process's. Every peer connection — Raft's streams and pipeline, the snapshot,
//!   a follower's lease keep-alives forwarded to the leader (`/leases`), the version checks — goes
//!   through the proxy of the member it is to, on the link of the member it is from.
//!   A Redis deployment under Sentinel has the same need: a replica and every Sentinel must reach the
//!   master (and a Sentinel every replica and every other Sentinel) at the address the others hear of
//!   — the master's `INFO` lists its replicas as they announce themselves (`replica-announce-port`), a
//!   Sentinel tells the others its own in its hellos (`sentinel announce-port`), and after a failover
//!   it sends the replicas `REPLICAOF` with the promoted replica's announced address. So each member
//!   announces its proxy's port, the proxy stands in front of its one port, and tells a connection's
//!   source by the working directory of the process at its other end, as for etcd.

use super::{free_ports, Fronted, Launcher, Member, PeerLinks, Ports, Server};
use crate::real::proxy::{Dir, Proxy, Source};
use locksim_locks::params::Params;
use locksim_sim::rng::{stream, ChaCha8Rng, Stream};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// The members of one cluster, and the proxies on their peer links.
pub struct Cluster {
    members: Vec<Mutex<Server>>,
    /// The peer links' proxies ([`Launcher::peer_links`]).
    proxies: Vec<Proxy>,
    /// The paths from one member to another through them.
    paths: Vec<Path>,
    /// Where each member says its clients' port is to the others, if the members announce addresses of
    /// their own there (the proxies' of a proxy per member in front of it, [`Fronted::Client`]); else
    /// empty.
    announced: Vec<SocketAddr>,
}

/// How the members of a cluster about to start reach each other: each member's view of the others'
/// ports ([`Member::view`]), and the proxies in between.
struct Peers {
    views: Vec<Vec<(u16, u16)>>,
    proxies: Vec<Proxy>,
    paths: Vec<Path>,
    announced: Vec<SocketAddr>,
}

impl Peers {
    /// Each member at its own ports (`own`: each member's client, peer and election port).
    fn direct(own: &[[u16; 3]]) -> Peers {
        let view: Vec<(u16, u16)> = own.iter().map(|[_, peer, election]| (*peer, *election)).collect();
        Peers { views: vec![view; own.len()], proxies: Vec::new(), paths: Vec::new(), announced: Vec::new() }
    }

    /// A quorum and an election proxy from each member to each other member (ZooKeeper); `rng` draws
    /// each path's.
    fn per_pair(own: &[[u16; 3]], rng: impl Fn(usize, usize) -> ChaCha8Rng) -> anyhow::Result<Peers> {
        let mut peers = Peers::direct(own);
        for (from, view) in peers.views.iter_mut().enumerate() {
            for to in (0..own.len()).filter(|to| *to != from) {
                let quorum = Proxy::start(addr(own[to][1]), rng(from, to))?;
                // The lower id's dial to a higher one is refused (see the module's comment).
                let election = match from > to {
                    true => Proxy::start(addr(own[to][2]), rng(from, to))?,
                    false => Proxy::refusing(rng(from, to))?,
                };
                view[to] = (quorum.addr().port(), election.addr().port());
                for proxy in [quorum, election] {
                    peers.paths.push(Path { from, to, proxy: peers.proxies.len(), link: 0 });
                    peers.proxies.push(proxy);
                }
            }
        }
        Ok(peers)
    }

    /// One proxy in front of each member's peer port, with a link per source member (etcd): a
    /// connection's source is the member whose working directory (of `dirs`, filled as the members
    /// start) the process at its other end has.
    fn per_member(
        own: &[[u16; 3]],
        fronted: Fronted,
        rng: impl Fn(usize, usize) -> ChaCha8Rng,
        dirs: Arc<Mutex<Vec<PathBuf>>>,
    ) -> anyhow::Result<Peers> {
        let source: Source = Arc::new(move |conn| {
            let dirs = dirs.lock().expect("directories lock").clone();
            crate::process::connected_from(conn, |pid| {
                let cwd = crate::process::cwd(pid)?;
                dirs.iter().position(|d| *d == cwd)
            })
        });
        let (n, mut proxies, mut paths) = (own.len(), Vec::new(), Vec::new());
        for (to, [client, peer, _]) in own.iter().enumerate() {
            let rngs = (0..n).map(|from| rng(from, to)).collect();
            paths.extend((0..n).map(|from| Path { from, to, proxy: proxies.len(), link: from }));
            let port = match fronted {
                Fronted::Client => *client,
                Fronted::Peer => *peer,
            };
            proxies.push(Proxy::by_source(addr(port), rngs, source.clone())?);
        }
        let view: Vec<(u16, u16)> = proxies.iter().map(|p| (p.addr().port(), 0)).collect();
        // What a member announces is a client port only where the proxies stand in front of one.
        let announced = match fronted {
            Fronted::Client => proxies.iter().map(Proxy::addr).collect(),
            Fronted::Peer => Vec::new(),
        };
        Ok(Peers { views: vec![view; n], proxies, paths, announced })
    }
}

/// A loopback port's address.
fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One way member `from` reaches member `to`: link `link` of proxy `proxy`.
struct Path {
    from: usize,
    to: usize,
    proxy: usize,
    link: usize,
}

impl Cluster {
    /// A cluster of one server.
    pub fn single(server: Server) -> Cluster {
        Cluster { members: vec![Mutex::new(server)], proxies: Vec::new(), paths: Vec::new(), announced: Vec::new() }
    }

    /// Start `n` members of `launcher`'s server with `backend`'s settings and wait until each answers;
    /// `seed` draws what the peer proxies draw. A cluster whose start fails (a member that does not
    /// answer, or drops its clients while it warms up: on a busy machine a young ensemble may elect
    /// again, its timeouts being a few ticks) is stopped and started afresh, up to three times.
    pub fn start(launcher: &'static Launcher, n: usize, backend: &Params, seed: u64) -> anyhow::Result<Cluster> {
        const ATTEMPTS: u32 = 3;
        for attempt in 1.. {
            match Cluster::start_once(launcher, n, backend, seed) {
                Err(_) if attempt < ATTEMPTS => continue,
                started => return started,
            }
        }
        unreachable!("the last attempt returns")
    }

    fn start_once(launcher: &'static Launcher, n: usize, backend: &Params, seed: u64) -> anyhow::Result<Cluster> {
        let own: Vec<[u16; 3]> = (0..n).map(|_| free_ports()).collect::<anyhow::Result<_>>()?;
        let rng = |from: usize, to: usize| stream(seed, Stream::Network, 1_000 + (from * n + to) as u64);
        // The members' working directories, as each starts: how a proxy per member knows its peers.
        let dirs: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let peers = match launcher.peer_links {
            PeerLinks::Direct => Peers::direct(&own),
            PeerLinks::PerPair => Peers::per_pair(&own, rng)?,
            PeerLinks::PerMember(fronted) => Peers::per_member(&own, fronted, rng, dirs.clone())?,
        };
        let mut members = Vec::new();
        for (index, [client, peer, election]) in own.iter().copied().enumerate() {
            let member = Member { index, view: peers.views[index].clone(), backend: backend.clone() };
            let server =
                Server::launch(launcher, Ports { client, peer, election, member: Some(member), upstream: None })?;
            if let Some(dir) = server.dir() {
                dirs.lock().expect("directories lock").push(dir.canonicalize()?);
            }
            members.push(server);
        }
        for member in &mut members {
            member.wait_ready()?;
        }
        let members = members.into_iter().map(Mutex::new).collect();
        Ok(Cluster { members, proxies: peers.proxies, paths: peers.paths, announced: peers.announced })
    }

    /// How many members it has.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `i`, for a fault to stop, crash or start again.
    pub fn member(&self, i: usize) -> MutexGuard<'_, Server> {
        self.members[i].lock().expect("member lock")
    }

    /// Where each member's clients connect.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.size()).map(|i| self.member(i).addr().0).collect()
    }

    /// Where each member says its clients' port is to the others, when they announce addresses of
    /// their own there (Redis under Sentinel: what a Sentinel answers when asked for the master).
    pub fn announced(&self) -> Option<&[SocketAddr]> {
        Some(&self.announced[..]).filter(|a| !a.is_empty())
    }

    /// The member leading the cluster now, as it says itself; `None` during an election, for a server
    /// that is no cluster, or when a member that leads is down or stopped. A member a fault is starting
    /// again (its lock held until it answers) leads nothing yet.
    pub fn leader(&self) -> Option<usize> {
        let leads = self.member(0).launcher().leads?;
        (0..self.size()).find(|i| match self.members[*i].try_lock() {
            Ok(member) => !member.is_down() && leads(member.addr().0),
            Err(_) => false,
        })
    }

    /// Whether its members' peer links can be cut ([`Launcher::peer_links`]).
    pub fn can_cut(&self) -> bool {
        !self.paths.is_empty()
    }

    /// Cut (`on`) or heal the peer links between members `a` and `b`, both ways: their bytes are held
    /// until the heal.
    pub fn cut(&self, a: usize, b: usize, on: bool) {
        let between = |p: &&Path| (p.from, p.to) == (a, b) || (p.from, p.to) == (b, a);
        for path in self.paths.iter().filter(between) {
            let link = self.proxies[path.proxy].link_from(path.link);
            link.cut(Dir::Up, on);
            link.cut(Dir::Down, on);
        }
    }
}
