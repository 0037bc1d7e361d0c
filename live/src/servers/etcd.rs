//! etcd (Debian 12 `etcd-server`, 3.4; `LOCKSIM_ETCD` may name a 3.5 binary from PyPI): one member, or a
//! member of a cluster ([`super::Cluster`]).

use super::{binary, Crash, Fronted, Launcher, PeerLinks, Ports};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;

pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::etcd::REAL,
    program: "etcd",
    launch,
    ready,
    warm_up: Launcher::cold,
    data: &["data"],
    crash: Crash::Kill,
    set_up: Launcher::as_started,
    leads: Some(leads),
    peer_links: PeerLinks::PerMember(Fronted::Peer),
    front: Launcher::alone,
};

/// A cluster of one member, its peer URL on the peer port; or member `etcd-N` of a cluster, which
/// listens for its peers on its peer port and announces its proxy's ([`super::Cluster`]), and whose
/// initial cluster lists every member's proxy. With Raft's pre-vote, as etcd 3.5 runs by default and
/// the model has it (3.4 defaults to none: a member back from a crash that times out before it hears
/// the leader calls an election and deposes it).
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let url = |port: u16| format!("http://127.0.0.1:{port}");
    let (client, peer) = (url(ports.client), url(ports.peer));
    let (name, announced, cluster) = match &ports.member {
        None => ("locksim".to_string(), peer.clone(), format!("locksim={peer}")),
        Some(member) => {
            let urls = member.view.iter().enumerate().map(|(j, (port, _))| format!("etcd-{j}={}", url(*port)));
            let announced = url(member.view[member.index].0);
            (format!("etcd-{}", member.index), announced, urls.collect::<Vec<_>>().join(","))
        }
    };
    let mut cmd = Command::new(binary("etcd", &["/usr/bin/etcd"])?);
    cmd.args(["--name", &name, "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &announced])
        .args(["--initial-cluster", &cluster, "--initial-cluster-token", "locksim", "--pre-vote"]);
    Ok(cmd)
}

/// Whether the member at `addr` leads its cluster: its status names itself the leader.
fn leads(addr: SocketAddr) -> bool {
    let Ok(text) = crate::wire::http::post(addr, "/v3/maintenance/status", "{}") else { return false };
    let Ok(status) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
    let me = &status["header"]["member_id"];
    !me.is_null() && *me == status["leader"]
}

/// A read needs a leader: the server is up and serving.
fn ready(_: TcpStream, addr: SocketAddr) -> bool {
    crate::wire::http::post(addr, "/v3/kv/range", r#"{"key":"AA=="}"#).is_ok()
}
