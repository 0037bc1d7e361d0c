//! Redis 7.0 (Debian 12 `redis-server`): one master, or a master with its replicas and three Sentinels
//! (`[backend] sentinels = 3`), started as a cluster ([`super::Cluster`]) whose members reach each
//! other through a proxy per member. A Sentinel is the same program in Sentinel mode
//! (`redis-server sentinel.conf --sentinel`, which is what Debian's `redis-sentinel` package runs).

use super::{binary, Crash, Fronted, Launcher, Member, PeerLinks, Ports};
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
/// than 100. `repl-diskless-sync-delay 0`: a master starts a replica's full synchronisation at once
/// (`syncCommand`), rather than in `replicationCron` once the replica has waited 5 whole seconds for
/// more to join it (Redis 7.0.15, `shouldStartChildReplication`), as the model's master feeds a replica
/// at once (docs/models.md says what that leaves out).
///
/// A cluster's members are, in the order of the family's nodes, the master (`redis-0`), its replicas
/// and the Sentinels ([`sentinel`]). Every data server announces its proxy (`replica-announce-ip`/
/// `-port`: the master too, which a failover may make a replica) and takes the `[backend]`'s
/// `min-replicas-*`; a replica follows the master at its proxy.
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let mut cmd = Command::new(binary("redis-server", &["/usr/bin/redis-server"])?);
    match &ports.member {
        Some(member) if member.index > member.backend.int("replicas") as usize => {
            sentinel(dir, ports.client, member)?;
            cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
        }
        member => {
            data_server(dir, ports.client, member.as_ref())?;
            cmd.arg(dir.join("redis.conf"));
        }
    }
    Ok(cmd)
}

/// Write a data server's `redis.conf` into `dir`, once (see [`launch`]): a server under Sentinel is
/// sent `REPLICAOF` and `CONFIG REWRITE` at a failover, and one that starts again after a crash keeps
/// the role Sentinel gave it, as the model's does (arguments on the command line would put it back
/// under its first master).
fn data_server(dir: &Path, port: u16, member: Option<&Member>) -> anyhow::Result<()> {
    let path = dir.join("redis.conf");
    if path.exists() {
        return Ok(());
    }
    let mut conf = format!(
        "port {port}\nbind 127.0.0.1\ndir {}\nappendonly yes\nappendfsync no\nsave \"\"\ndaemonize no\nhz 100\n\
         protected-mode no\nlogfile \"\"\nrepl-diskless-sync-delay 0\n",
        dir.display()
    );
    if let Some(member) = member {
        let backend = &member.backend;
        conf += &format!(
            "min-replicas-to-write {}\nmin-replicas-max-lag {}\nreplica-announce-ip 127.0.0.1\n\
             replica-announce-port {}\n",
            backend.int("min_replicas_to_write"),
            backend.duration("min_replicas_max_lag").as_secs(),
            member.view[member.index].0
        );
        if member.index > 0 {
            conf += &format!("replicaof 127.0.0.1 {}\n", member.view[0].0);
        }
    }
    std::fs::write(&path, conf)?;
    Ok(())
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
fn sentinel(dir: &Path, port: u16, member: &Member) -> anyhow::Result<()> {
    let backend = &member.backend;
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
/// and a Sentinel are ready as they answer.
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

#[cfg(test)]
mod tests {
    use super::*;
    use locksim_locks::params::{ParamValue, Params};
    use locksim_locks::redis::BACKEND_PARAMS;

    /// Member `index` of a master, two replicas and three Sentinels, each member's proxy at port
    /// 1000 + its index.
    fn member(index: usize) -> Member {
        let given = [("replicas", ParamValue::Int(2)), ("sentinels", ParamValue::Int(3))];
        let backend = Params::resolve(BACKEND_PARAMS, given);
        Member { index, view: (0..6).map(|i| (1000 + i as u16, 0)).collect(), backend }
    }

    /// Every data server announces its proxy (the master too: a failover may make it a replica), a
    /// replica follows the master's, and a file once written is the server's own: what Sentinel
    /// rewrote survives a restart.
    #[test]
    fn a_members_configuration_announces_its_proxy_and_is_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        data_server(dir.path(), 7000, Some(&member(0))).unwrap();
        let master = read("redis.conf");
        assert!(master.contains("replica-announce-port 1000\n") && !master.contains("replicaof"), "{master}");
        std::fs::write(dir.path().join("redis.conf"), "replicaof 127.0.0.1 1001\n").unwrap();
        data_server(dir.path(), 7000, Some(&member(0))).unwrap();
        assert_eq!(read("redis.conf"), "replicaof 127.0.0.1 1001\n");

        let dir = tempfile::tempdir().unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        data_server(dir.path(), 7001, Some(&member(2))).unwrap();
        let replica = read("redis.conf");
        assert!(replica.contains("replicaof 127.0.0.1 1000\n"), "{replica}");
        assert!(replica.contains("replica-announce-port 1002\n"), "{replica}");
        sentinel(dir.path(), 7003, &member(3)).unwrap();
        let conf = read("sentinel.conf");
        assert!(conf.contains(&format!("sentinel monitor {SENTINEL_MASTER} 127.0.0.1 1000 2\n")), "{conf}");
        assert!(conf.contains("sentinel announce-port 1003\n"), "{conf}");
        assert!(conf.contains(&format!("sentinel known-replica {SENTINEL_MASTER} 127.0.0.1 1002\n")), "{conf}");
        let known: Vec<&str> = conf.lines().filter(|l| l.starts_with("sentinel known-sentinel")).collect();
        assert_eq!(known.len(), 2, "the other two Sentinels: {conf}");
    }
}
