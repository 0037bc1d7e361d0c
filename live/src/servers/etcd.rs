//! etcd, one member (Debian 12 `etcd-server`, 3.4; `LOCKSIM_ETCD` may name a 3.5 binary from PyPI).

use super::{binary, Crash, Launcher};
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
};

/// A cluster of one member, its peer URL on `peer_port`.
fn launch(dir: &Path, port: u16, peer_port: u16) -> anyhow::Result<Command> {
    let (client, peer) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{peer_port}"));
    let mut cmd = Command::new(binary("etcd", &["/usr/bin/etcd"])?);
    cmd.args(["--name", "locksim", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("locksim={peer}")]);
    Ok(cmd)
}

/// A read needs a leader: the server is up and serving.
fn ready(_: TcpStream, addr: SocketAddr) -> bool {
    crate::wire::http::post(addr, "/v3/kv/range", r#"{"key":"AA=="}"#).is_ok()
}
