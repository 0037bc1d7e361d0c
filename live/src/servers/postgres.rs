//! PostgreSQL 15 (Debian 12 `postgresql-15`), a cluster of its own made by `initdb`.

use super::{binary, Crash, Launcher, PeerLinks, Ports};
use locksim_locks::params::Params;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::sql::REAL,
    program: "postgres",
    launch,
    ready,
    warm_up: Launcher::cold,
    data: &["data"],
    crash: Crash::ImmediateShutdown,
    set_up,
    leads: None,
    peer_links: PeerLinks::Direct,
    front,
};

/// pgbouncer in front of it when the `[backend]` asks for a pooler.
fn front(backend: &Params) -> Option<&'static Launcher> {
    (backend.choice("pooler") != "none").then_some(&super::PGBOUNCER)
}

/// PostgreSQL: a cluster made by `initdb` in `dir/data` on the first start (trust authentication,
/// as the `postgres` user when locksim runs as root, since PostgreSQL refuses to run as root), then
/// the server on loopback only. `fsync` is off: it costs time and changes nothing a script can see
/// (the kernel keeps what a killed process wrote), while `synchronous_commit` stays on, or a crash
/// would lose transactions committed in the last few hundred milliseconds; no checkpoints on a timer, so
/// that what a sequence logs ahead (and so skips after a crash) does not depend on when a script runs.
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let port = ports.client;
    let bin = |name: &str| binary(name, &[&format!("/usr/lib/postgresql/15/bin/{name}")]);
    let user = postgres_user(dir)?;
    let data = dir.join("data");
    if !data.join("PG_VERSION").exists() {
        let mut initdb = Command::new(bin("initdb")?);
        initdb.arg("-D").arg(&data).args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
        let out = as_user(&mut initdb, user).current_dir(dir).stdin(Stdio::null()).output()?;
        if !out.status.success() {
            anyhow::bail!("initdb failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    let mut cmd = Command::new(bin("postgres")?);
    cmd.arg("-D").arg(&data).args(["-p", &port.to_string()]);
    for setting in [
        "listen_addresses=127.0.0.1",
        "unix_socket_directories=",
        "fsync=off",
        "full_page_writes=off",
        "checkpoint_timeout=1d",
        "shared_buffers=16MB",
        "logging_collector=off",
    ] {
        cmd.args(["-c", setting]);
    }
    as_user(&mut cmd, user);
    Ok(cmd)
}

/// Who PostgreSQL runs as: when locksim is root, the `postgres` user the Debian package made (and
/// `dir` is given to it); otherwise locksim's own user.
pub(super) fn postgres_user(dir: &Path) -> anyhow::Result<Option<(u32, u32)>> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    // SAFETY: getpwnam with a NUL-terminated name; the record is read at once, before any other call.
    let entry = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    if entry.is_null() {
        anyhow::bail!("PostgreSQL will not run as root and there is no `postgres` user: run .ci/install-servers");
    }
    // SAFETY: a non-null record from getpwnam.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    Ok(Some((uid, gid)))
}

pub(super) fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(cmd, uid);
        std::os::unix::process::CommandExt::gid(cmd, gid);
    }
    cmd
}

pub(super) fn ready(_: TcpStream, addr: SocketAddr) -> bool {
    crate::wire::pgwire::Conn::connect(addr, Duration::from_millis(200))
        .is_ok_and(|mut c| c.query("SELECT 1").is_ok_and(|r| r.error.is_none()))
}

/// Make the built-in database recipes' tables on a fresh real PostgreSQL, and give its sessions the
/// scenario's `[backend]` settings (as the simulated server starts with them).
fn set_up(addr: SocketAddr, backend: &Params) -> anyhow::Result<()> {
    let mut conn = crate::wire::pgwire::Conn::connect(addr, Duration::from_secs(10))?;
    let ms = |name: &str| format!("'{}ms'", backend.duration(name).as_millis());
    let settings = [
        format!("idle_in_transaction_session_timeout = {}", ms("idle_in_transaction_session_timeout")),
        format!("tcp_keepalives_idle = {}", ms("tcp_keepalives_idle")),
        format!("tcp_keepalives_interval = {}", ms("tcp_keepalives_interval")),
        format!("tcp_keepalives_count = {}", backend.int("tcp_keepalives_count")),
    ];
    let statements = std::iter::once(locksim_locks::sql::SCHEMA.to_string())
        .chain(settings.iter().map(|s| format!("ALTER DATABASE postgres SET {s}")));
    for statement in statements {
        if let Some((code, message)) = conn.query(&statement)?.error {
            anyhow::bail!("preparing the real database: {statement}: {code} {message}");
        }
    }
    conn.terminate();
    Ok(())
}
