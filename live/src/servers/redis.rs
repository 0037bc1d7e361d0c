//! Redis 7.0 (Debian 12 `redis-server`): one master, or a master with its replicas and three Sentinels
//! (`[backend] sentinels = 3`), started as a cluster ([`super::Cluster`]) whose members reach each
//! other through a proxy per member. A Sentinel is the same program in Sentinel mode
//! (`redis-server sentinel.conf --sentinel`, which is what Debian's `redis-sentinel` package runs).

use super::{binary, Crash, Fronted, Launcher, Member, PeerLinks, Ports};
use locksim_locks::params::Params;
use locksim_locks::redis::SENTINEL_MASTER;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;

pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::redis::REAL,
    program: "redis-server",
    launch,
    ready,
    warm_up: synced,
    data: &["appendonlydir", "dump.rdb"],
    crash: Crash::Kill,
    set_up: Launcher::as_started,
    leads: None,
    peer_links: PeerLinks::PerMember(Fronted::Client),
    front: Launcher::alone,
};

/// Persistence by AOF: Redis write()s the AOF before it replies, so a killed process loses no
/// acknowledged write (the kernel has it; fsync matters only when the machine dies), as the model's
/// `persist = true` assumes — and `appendfsync no` keeps a write from waiting on the disk. No RDB
/// snapshots, no protected mode; `hz 100` so that a `WAIT` times out within 10 ms of its time rather
/// than 100.
///
/// A cluster's members are, in the order of the family's nodes, the master (`redis-0`), its replicas
/// and the Sentinels ([`sentinel`]). A replica follows the master at its proxy and announces its own
/// proxy (`replica-announce-ip`/`-port`); every data server takes the `[backend]`'s `min-replicas-*`.
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let port = ports.client;
    let mut cmd = Command::new(binary("redis-server", &["/usr/bin/redis-server"])?);
    let Some(member) = &ports.member else {
        data_server(&mut cmd, dir, port);
        return Ok(cmd);
    };
    let backend = &member.backend;
    if member.index > backend.int("replicas") as usize {
        sentinel(dir, port, member, backend)?;
        cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
        return Ok(cmd);
    }
    data_server(&mut cmd, dir, port);
    let min_replicas =
        [backend.int("min_replicas_to_write"), backend.duration("min_replicas_max_lag").as_secs() as i64];
    cmd.args(["--min-replicas-to-write", &min_replicas[0].to_string(), "--min-replicas-max-lag"])
        .arg(min_replicas[1].to_string());
    if member.index > 0 {
        let master = member.view[0].0.to_string();
        cmd.args(["--replicaof", "127.0.0.1", &master, "--replica-announce-ip", "127.0.0.1"])
            .args(["--replica-announce-port", &member.view[member.index].0.to_string()]);
    }
    Ok(cmd)
}

/// A data server's arguments (see [`launch`]).
fn data_server(cmd: &mut Command, dir: &Path, port: u16) {
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
        .arg(dir)
        .args(["--appendonly", "yes", "--appendfsync", "no", "--save", "", "--daemonize", "no", "--hz", "100"])
        .args(["--protected-mode", "no", "--logfile", ""]);
}

/// Write a Sentinel's `sentinel.conf` into `dir`, once: a Sentinel rewrites its file as its view
/// changes (its epochs, the master it switched to, the replicas and Sentinels it found), and one that
/// starts again after a crash goes on from there. It listens on `port`, announces its proxy, and
/// monitors the master at the master's proxy with the `[backend]`'s `down_after`, `failover_timeout`
/// and `quorum`; `parallel-syncs` is the number of replicas, so that a failover points every other
/// replica at the promoted one at once, as the model does. Its timer keeps Redis's own `hz` (Sentinel
/// draws it anew each run to desynchronise Sentinels).
///
/// It knows the replicas and the other Sentinels from the start (`known-replica`, `known-sentinel`,
/// each Sentinel's id fixed by its place), as the model's Sentinels do: a real one otherwise learns of
/// the replicas from the master's `INFO`, every 10 s, and a run's fault could come before it has.
fn sentinel(dir: &Path, port: u16, member: &Member, backend: &Params) -> anyhow::Result<()> {
    let path = dir.join("sentinel.conf");
    if path.exists() {
        return Ok(());
    }
    let ms = |key: &str| backend.duration(key).as_millis();
    let (name, replicas) = (SENTINEL_MASTER, backend.int("replicas") as usize);
    let at = |i: usize| member.view[i].0;
    let id = |i: usize| format!("{:040x}", i);
    let mut conf = format!(
        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\nlogfile \"\"\ndir {dir}\n\
         sentinel myid {myid}\nsentinel announce-ip 127.0.0.1\nsentinel announce-port {announced}\n\
         sentinel monitor {name} 127.0.0.1 {master} {quorum}\n\
         sentinel down-after-milliseconds {name} {down_after}\nsentinel failover-timeout {name} {failover}\n\
         sentinel parallel-syncs {name} {replicas}\n",
        dir = dir.display(),
        myid = id(member.index),
        announced = at(member.index),
        master = at(0),
        quorum = backend.int("quorum"),
        down_after = ms("down_after"),
        failover = ms("failover_timeout"),
    );
    for replica in 1..=replicas {
        conf += &format!("sentinel known-replica {name} 127.0.0.1 {}\n", at(replica));
    }
    for other in (replicas + 1..member.view.len()).filter(|i| *i != member.index) {
        conf += &format!("sentinel known-sentinel {name} 127.0.0.1 {} {}\n", at(other), id(other));
    }
    std::fs::write(&path, conf)?;
    Ok(())
}

/// A replica is ready once its first synchronisation with the master is done (`INFO replication`:
/// `master_link_status:up`), as the model's replicas are from the start: before that it acknowledges
/// nothing, so a `WAIT` in the run's first seconds (Redisson's lock) would find no replica. A master
/// holds a diskless synchronisation back `repl-diskless-sync-delay` (5 s by default) for more replicas
/// to join it. A master and a Sentinel are ready as they answer.
fn synced(addr: SocketAddr) -> anyhow::Result<()> {
    let mut conn = crate::wire::resp::Conn::on(TcpStream::connect(addr)?);
    let info = match conn.command(&["INFO", "replication"])? {
        crate::wire::resp::Value::Bulk(Some(text)) => text,
        _ => String::new(),
    };
    if info.contains("role:slave") && !info.contains("master_link_status:up") {
        anyhow::bail!("the replica is still synchronising with its master");
    }
    Ok(())
}

/// A data server and a Sentinel both answer `PING`.
fn ready(stream: TcpStream, _: SocketAddr) -> bool {
    let mut conn = crate::wire::resp::Conn::on(stream);
    matches!(conn.command(&["PING"]), Ok(crate::wire::resp::Value::Simple(s)) if s == "PONG")
}
