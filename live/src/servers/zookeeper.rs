//! ZooKeeper 3.8 (Debian 12 `zookeeper`), standalone, with tickTime [`TICK_MS`].

use super::{binary, Crash, Launcher};
use crate::wire::jute::{Body, Conn, CLOSE_SESSION, CREATE2, DELETE, EXISTS, GET_CHILDREN2, PING};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;

pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::zk::REAL,
    program: "zookeeper",
    launch,
    ready,
    warm_up,
    data: &["data"],
    crash: Crash::Kill,
    set_up: Launcher::as_started,
};

/// The tickTime of the `zoo.cfg` this launcher writes, as the ZooKeeper family declares it.
pub const TICK_MS: u64 = locksim_locks::zk::REAL_TICK.as_millis() as u64;

/// Standalone, as Debian's zkServer.sh runs it, from a zoo.cfg of our own: no admin server, only `ruok`
/// and `srvr` of the four-letter words, and no logging (slf4j finds no binding on the class path, so
/// nothing is written outside the directory).
fn launch(dir: &Path, port: u16, _: u16) -> anyhow::Result<Command> {
    let jar = ["/usr/share/java/zookeeper.jar"].into_iter().find(|p| Path::new(p).is_file()).ok_or_else(|| {
        anyhow::anyhow!("zookeeper is not installed: run .ci/install-servers (Debian packages, as root)")
    })?;
    let cfg = dir.join("zoo.cfg");
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    std::fs::write(
        &cfg,
        format!(
            "tickTime={TICK_MS}\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n",
            data.display()
        ),
    )?;
    let mut cmd = Command::new(binary("java", &["/usr/bin/java"])?);
    cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", jar])
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(&cfg);
    Ok(cmd)
}

/// A session: the server has loaded its data and serves.
fn ready(_: TcpStream, addr: SocketAddr) -> bool {
    match Conn::connect(addr, 4000, None) {
        Ok(Ok(mut conn)) => conn.call(CLOSE_SESSION, Body::default()).is_ok(),
        _ => false,
    }
}

/// Run a freshly started JVM's request paths a few hundred times, so that a script's first requests
/// after a (re)start are not answered late by a cold JIT (which would make the seed inconclusive).
fn warm_up(addr: SocketAddr) -> anyhow::Result<()> {
    let Ok(mut conn) = Conn::connect(addr, 4000, None)? else { anyhow::bail!("ZooKeeper refused a session") };
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
