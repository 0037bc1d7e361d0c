//! A cluster of real servers on loopback: a ZooKeeper ensemble, an etcd cluster. Every member is
//! started at once (none answers before a quorum is up), each in its own temporary directory, and
//! stopped with the cluster.
//!
//! **Peer links through proxies** ([`Launcher::peer_proxies`], ZooKeeper): each member reaches each
//! other member through a proxy of its own ([`crate::real::proxy`]) — its zoo.cfg names the proxy's port
//! for that member — so that [`Cluster::cut`] can hold the bytes between two members, as a partition
//! does, while their clients still reach both. ZooKeeper keeps one election connection per pair of
//! servers, the one the higher id opens: when the lower id dials, the higher one drops the connection
//! and dials back to the address the lower one announced (`QuorumCnxManager.handleConnection`), which
//! would go round the proxy. So the proxy from a lower id to a higher one refuses every connection,
//! and the pair's election connection is always the higher id's, through its proxy. The quorum
//! connection is always the follower's, to its leader's quorum port through its proxy.
//!
//! etcd's members reach each other directly: its member ids are a hash of the peer URLs of the initial
//! cluster, which every member must list alike, so a member cannot reach another at an address of its own.

use super::{free_ports, Launcher, Member, Ports, Server};
use crate::real::proxy::{Dir, Proxy};
use locksim_locks::params::Params;
use locksim_sim::rng::{stream, Stream};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

/// The members of one cluster, and the proxies on their peer links.
pub struct Cluster {
    members: Vec<Mutex<Server>>,
    /// The peer links' proxies (with [`Launcher::peer_proxies`]): from one member to another.
    peers: Vec<PeerLink>,
}

/// How member `from` reaches member `to`: a proxy to its quorum (or peer) port and one to its
/// election port.
struct PeerLink {
    from: usize,
    to: usize,
    proxies: [Proxy; 2],
}

impl Cluster {
    /// A cluster of one server.
    pub fn single(server: Server) -> Cluster {
        Cluster { members: vec![Mutex::new(server)], peers: Vec::new() }
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
        let mut peers = Vec::new();
        if launcher.peer_proxies {
            for from in 0..n {
                for to in (0..n).filter(|to| *to != from) {
                    let rng = || stream(seed, Stream::Network, 1_000 + (from * n + to) as u64);
                    let quorum = Proxy::start(addr(own[to][1]), rng())?;
                    // The lower id's dial to a higher one is refused (see the module's comment).
                    let election = match from > to {
                        true => Proxy::start(addr(own[to][2]), rng())?,
                        false => Proxy::refusing(rng())?,
                    };
                    peers.push(PeerLink { from, to, proxies: [quorum, election] });
                }
            }
        }
        let view = |i: usize| -> Vec<(u16, u16)> {
            (0..n)
                .map(|j| match peers.iter().find(|l| l.from == i && l.to == j) {
                    Some(link) => (link.proxies[0].addr().port(), link.proxies[1].addr().port()),
                    None => (own[j][1], own[j][2]),
                })
                .collect()
        };
        let mut members = Vec::new();
        for (index, [client, peer, election]) in own.iter().copied().enumerate() {
            let member = Member { index, view: view(index), backend: backend.clone() };
            members.push(Server::launch(launcher, Ports { client, peer, election, member: Some(member) })?);
        }
        for member in &mut members {
            member.wait_ready()?;
        }
        Ok(Cluster { members: members.into_iter().map(Mutex::new).collect(), peers })
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

    /// Whether its members' peer links can be cut ([`Launcher::peer_proxies`]).
    pub fn can_cut(&self) -> bool {
        !self.peers.is_empty()
    }

    /// Cut (`on`) or heal the peer links between members `a` and `b`, both ways: their bytes are held
    /// until the heal.
    pub fn cut(&self, a: usize, b: usize, on: bool) {
        let between = |l: &&PeerLink| (l.from, l.to) == (a, b) || (l.from, l.to) == (b, a);
        for link in self.peers.iter().filter(between) {
            for proxy in &link.proxies {
                proxy.link().cut(Dir::Up, on);
                proxy.link().cut(Dir::Down, on);
            }
        }
    }
}
