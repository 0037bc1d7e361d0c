//! Redis 7.0 (Debian 12 `redis-server`), one master.

use super::{binary, Crash, Launcher, PeerLinks, Ports};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;

pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::redis::REAL,
    program: "redis-server",
    launch,
    ready,
    warm_up: Launcher::cold,
    data: &["appendonlydir", "dump.rdb"],
    crash: Crash::Kill,
    set_up: Launcher::as_started,
    leads: None,
    peer_links: PeerLinks::Direct,
    front: Launcher::alone,
};

/// Persistence by AOF: Redis write()s the AOF before it replies, so a killed process loses no
/// acknowledged write (the kernel has it; fsync matters only when the machine dies), as the model's
/// `persist = true` assumes — and `appendfsync no` keeps a write from waiting on the disk. No RDB
/// snapshots, no protected mode; `hz 100` so that a `WAIT` times out within 10 ms of its time rather
/// than 100.
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let port = ports.client;
    let mut cmd = Command::new(binary("redis-server", &["/usr/bin/redis-server"])?);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
        .arg(dir)
        .args(["--appendonly", "yes", "--appendfsync", "no", "--save", "", "--daemonize", "no", "--hz", "100"])
        .args(["--protected-mode", "no", "--logfile", ""]);
    Ok(cmd)
}

fn ready(stream: TcpStream, _: SocketAddr) -> bool {
    let mut conn = crate::wire::resp::Conn::on(stream);
    matches!(conn.command(&["PING"]), Ok(crate::wire::resp::Value::Simple(s)) if s == "PONG")
}
