//! ZooKeeper 3.8 (Debian 12 `zookeeper`): standalone, with tickTime [`TICK_MS`], or a member of an
//! ensemble ([`super::Cluster`]) with the ensemble's `[backend]` timing.

use super::{binary, Crash, Launcher, Member, PeerLinks, Ports};
use crate::wire::jute::{Body, Conn, CLOSE_SESSION, CREATE2, DELETE, EXISTS, GET_CHILDREN2, PING};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::zk::REAL,
    program: "zookeeper",
    launch,
    ready,
    warm_up,
    data: &["data"],
    crash: Crash::Kill,
    set_up: Launcher::as_started,
    leads: Some(leads),
    peer_links: PeerLinks::PerPair,
    front: Launcher::alone,
};

/// The tickTime of the `zoo.cfg` this launcher writes, as the ZooKeeper family declares it.
pub const TICK_MS: u64 = locksim_locks::zk::REAL_TICK.as_millis() as u64;

/// As Debian's zkServer.sh runs it, from a zoo.cfg of our own: no admin server, only `ruok` and `srvr`
/// of the four-letter words, and no logging (slf4j finds no binding on the class path, so nothing is
/// written outside the directory). Standalone, or an ensemble's member ([`member_cfg`]).
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let jar = ["/usr/share/java/zookeeper.jar"].into_iter().find(|p| Path::new(p).is_file()).ok_or_else(|| {
        anyhow::anyhow!("zookeeper is not installed: run .ci/install-servers (Debian packages, as root)")
    })?;
    let cfg = dir.join("zoo.cfg");
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let (tick_ms, ensemble) = match &ports.member {
        None => (TICK_MS, String::new()),
        Some(member) => {
            std::fs::write(data.join("myid"), format!("{}\n", member.index + 1))?;
            (member.backend.duration("tick_time").as_millis() as u64, member_cfg(member))
        }
    };
    std::fs::write(
        &cfg,
        format!(
            "tickTime={tick_ms}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n{ensemble}",
            data.display(),
            ports.client
        ),
    )?;
    let mut cmd = Command::new(binary("java", &["/usr/bin/java"])?);
    cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", jar]);
    match ports.member {
        None => cmd.arg("org.apache.zookeeper.server.ZooKeeperServerMain"),
        Some(_) => cmd.arg("org.apache.zookeeper.server.quorum.QuorumPeerMain"),
    };
    cmd.arg(&cfg);
    Ok(cmd)
}

/// An ensemble member's lines of zoo.cfg: the limits, and `server.N` (its `myid` is N) for every
/// member as this one reaches it — through the cluster's proxies, its own entry its own ports. No
/// fsync of the transaction log (`forceSync=no`): a killed member loses nothing the kernel has, and three
/// members fsyncing every write on one disk would slow every grant.
fn member_cfg(member: &Member) -> String {
    let backend = &member.backend;
    let limits = (backend.int("init_limit"), backend.int("sync_limit"));
    let mut cfg = format!("initLimit={}\nsyncLimit={}\nforceSync=no\n", limits.0, limits.1);
    for (j, (quorum, election)) in member.view.iter().enumerate() {
        cfg.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", j + 1));
    }
    cfg
}

/// Whether the member at `addr` leads its ensemble: `srvr` says `Mode: leader`.
fn leads(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = String::new();
    stream.write_all(b"srvr").is_ok() && stream.read_to_string(&mut answer).is_ok() && answer.contains("Mode: leader")
}

/// A session: the server has loaded its data and serves.
fn ready(_: TcpStream, addr: SocketAddr) -> bool {
    match Conn::connect(addr, 4000, None, 0) {
        Ok(Ok(mut conn)) => conn.call(CLOSE_SESSION, Body::default()).is_ok(),
        _ => false,
    }
}

/// Run a freshly started JVM's request paths a few hundred times, so that a script's first requests
/// after a (re)start are not answered late by a cold JIT (which would make the seed inconclusive).
fn warm_up(addr: SocketAddr) -> anyhow::Result<()> {
    let Ok(mut conn) = Conn::connect(addr, 4000, None, 0)? else { anyhow::bail!("ZooKeeper refused a session") };
    let path = "/locksim-warm-up";
    for _ in 0..100 {
        conn.call(CREATE2, Body::default().str(path).str("").open_acl().int(0))?;
        conn.call(EXISTS, Body::default().str(path).bool(true))?;
        conn.call(GET_CHILDREN2, Body::default().str("/").bool(false))?;
        conn.call(DELETE, Body::default().str(path).int(-1))?;
        conn.call(PING, Body::default())?;
    }
    conn.call(CLOSE_SESSION, Body::default())?;
    Ok(())
}
