//! pgbouncer 1.18 (Debian 12 `pgbouncer`) in front of a PostgreSQL server locksim started: what a
//! scenario's `[backend] pooler` asks for in real mode, as the simulated server's pooler
//! (`sim/src/backend/sql/pool.rs`) stands in front of the simulated one.

use super::{binary, postgres, Crash, Launcher, PeerLinks, Ports};
use std::path::Path;
use std::process::Command;

/// Never found by [`Launcher::of`] (PostgreSQL's is): started with [`super::Server::start_in_front`].
pub static LAUNCHER: Launcher = Launcher {
    server: &locksim_locks::sql::REAL,
    program: "pgbouncer",
    launch,
    // It answers once it has connected to its PostgreSQL.
    ready: postgres::ready,
    warm_up: Launcher::cold,
    data: &[],
    crash: Crash::Kill,
    set_up: Launcher::as_started,
    leads: None,
    peer_links: PeerLinks::Direct,
    front: Launcher::alone,
};

/// pgbouncer with the `[backend]`'s `pooler` as its `pool_mode`, `pool_size` as its
/// `default_pool_size`, and `server_reset_query_always`, `server_idle_timeout` and `server_lifetime` as
/// its own (times in seconds, fractions allowed: libusual's `parse_time` reads a decimal), pooling
/// database `postgres` of the server on the upstream port for user
/// `postgres` (trusted, as the server trusts it), everything else at its default — `server_reset_query`
/// `DISCARD ALL`, run in session mode only, and `server_round_robin` off (last released first). As the
/// `postgres` user when locksim runs as root: pgbouncer refuses to run as root.
fn launch(dir: &Path, ports: &Ports) -> anyhow::Result<Command> {
    let Some(upstream) = &ports.upstream else { anyhow::bail!("pgbouncer needs the PostgreSQL server it pools") };
    let user = postgres::postgres_user(dir)?;
    let config = format!(
        "[databases]\n\
         postgres = host=127.0.0.1 port={} dbname=postgres user=postgres\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {}\n\
         pool_mode = {}\n\
         default_pool_size = {}\n\
         server_reset_query_always = {}\n\
         server_idle_timeout = {}\n\
         server_lifetime = {}\n\
         max_client_conn = 1000\n\
         ignore_startup_parameters = extra_float_digits,options\n",
        upstream.port,
        ports.client,
        dir.join("userlist.txt").display(),
        upstream.backend.choice("pooler"),
        upstream.backend.int("pool_size"),
        u8::from(upstream.backend.bool("server_reset_query_always")),
        upstream.backend.duration("server_idle_timeout").as_secs_f64(),
        upstream.backend.duration("server_lifetime").as_secs_f64(),
    );
    std::fs::write(dir.join("pgbouncer.ini"), config)?;
    // Trust still needs the user listed.
    std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n")?;
    let mut cmd = Command::new(binary("pgbouncer", &["/usr/sbin/pgbouncer"])?);
    cmd.arg(dir.join("pgbouncer.ini"));
    postgres::as_user(&mut cmd, user);
    Ok(cmd)
}
