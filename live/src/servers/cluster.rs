//! A cluster of real servers on loopback: a ZooKeeper ensemble, an etcd cluster. Every member is
//! started at once (none answers before a quorum is up), each in its own temporary directory, and
//! stopped with the cluster.
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

use super::{free_ports, Launcher, Member, PeerLinks, Ports, Server};
use crate::real::proxy::{Dir, Proxy, Source};
use locksim_locks::params::Params;
use locksim_sim::rng::{stream, Stream};
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
        Cluster { members: vec![Mutex::new(server)], proxies: Vec::new(), paths: Vec::new() }
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
        let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let rng = |from: usize, to: usize| stream(seed, Stream::Network, 1_000 + (from * n + to) as u64);
        let (mut proxies, mut paths) = (Vec::new(), Vec::new());
        // The members' working directories, as each starts: how a proxy per member knows its peers.
        let dirs: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let view: Box<dyn Fn(usize) -> Vec<(u16, u16)>> = match launcher.peer_links {
            PeerLinks::Direct => Box::new(|_| own.iter().map(|[_, peer, election]| (*peer, *election)).collect()),
            PeerLinks::PerPair => {
                let mut ports: Vec<Vec<(u16, u16)>> =
                    (0..n).map(|_| own.iter().map(|p| (p[1], p[2])).collect()).collect();
                for (from, view) in ports.iter_mut().enumerate() {
                    for to in (0..n).filter(|to| *to != from) {
                        let quorum = Proxy::start(addr(own[to][1]), rng(from, to))?;
                        // The lower id's dial to a higher one is refused (see the module's comment).
                        let election = match from > to {
                            true => Proxy::start(addr(own[to][2]), rng(from, to))?,
                            false => Proxy::refusing(rng(from, to))?,
                        };
                        view[to] = (quorum.addr().port(), election.addr().port());
                        for proxy in [quorum, election] {
                            paths.push(Path { from, to, proxy: proxies.len(), link: 0 });
                            proxies.push(proxy);
                        }
                    }
                }
                Box::new(move |i| ports[i].clone())
            }
            PeerLinks::PerMember => {
                let known = dirs.clone();
                let source: Source = Arc::new(move |conn| {
                    let dirs = known.lock().expect("directories lock").clone();
                    crate::process::connected_from(conn, |pid| {
                        let cwd = crate::process::cwd(pid)?;
                        dirs.iter().position(|d| *d == cwd)
                    })
                });
                for (to, [_, peer, _]) in own.iter().enumerate() {
                    let rngs = (0..n).map(|from| rng(from, to)).collect();
                    paths.extend((0..n).map(|from| Path { from, to, proxy: proxies.len(), link: from }));
                    proxies.push(Proxy::by_source(addr(*peer), rngs, source.clone())?);
                }
                let ports: Vec<(u16, u16)> = proxies.iter().map(|p| (p.addr().port(), 0)).collect();
                Box::new(move |_| ports.clone())
            }
        };
        let mut members = Vec::new();
        for (index, [client, peer, election]) in own.iter().copied().enumerate() {
            let member = Member { index, view: view(index), backend: backend.clone() };
            let server = Server::launch(launcher, Ports { client, peer, election, member: Some(member) })?;
            if let Some(dir) = server.dir() {
                dirs.lock().expect("directories lock").push(dir.canonicalize()?);
            }
            members.push(server);
        }
        for member in &mut members {
            member.wait_ready()?;
        }
        Ok(Cluster { members: members.into_iter().map(Mutex::new).collect(), proxies, paths })
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
