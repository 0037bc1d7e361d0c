//! Real servers on loopback, started by locksim from the Debian packages `.ci/install-servers`
//! installs: each in its own temporary directory (data, configuration, logs) on a free port, waited for
//! until it answers, and stopped at the end — on success, on an error, on a panic, and on Ctrl-C or
//! SIGTERM (a handler kills every server still running and removes its directory). Nothing is written
//! outside the temporary directory. Or `--server HOST:PORT` points at one already running; locksim then
//! neither restarts nor stops it: scripts are played without their restarts and stops. ZooKeeper and etcd
//! also run as a cluster of members, started together ([`Cluster`]).

use crate::process::{self, alive, children};
use locksim_locks::params::Params;
use locksim_locks::RealServer;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod cluster;
mod etcd;
mod pgbouncer;
mod postgres;
mod redis;
mod zookeeper;

pub use cluster::Cluster;
pub use etcd::LAUNCHER as ETCD;
pub use pgbouncer::LAUNCHER as PGBOUNCER;
pub use postgres::LAUNCHER as POSTGRES;
pub use redis::LAUNCHER as REDIS;
pub use zookeeper::{LAUNCHER as ZOOKEEPER, TICK_MS as ZK_TICK_MS};

/// Every launcher: one per [`locksim_locks::REAL_SERVERS`] entry (a test holds them to it).
static LAUNCHERS: &[&Launcher] = &[&REDIS, &ETCD, &ZOOKEEPER, &POSTGRES];

/// How locksim runs one kind of real server (each in a module of its own): how it starts, how it is
/// seen to serve, what of its directory is its data, how it crashes, and how a built-in recipe's
/// scenario sets it up. What the rest of locksim calls the server is its family's [`RealServer`].
pub struct Launcher {
    /// The server, as its family declares it.
    pub server: &'static RealServer,
    /// Its program, as messages and its temporary directory name it (e.g. `redis-server`).
    pub program: &'static str,
    /// The command that starts it in `dir` on `ports`, its configuration written.
    launch: fn(dir: &Path, ports: &Ports) -> anyhow::Result<Command>,
    /// Whether it answers its simplest request on `stream`, a fresh connection to it at `addr`.
    ready: fn(stream: TcpStream, addr: SocketAddr) -> bool,
    /// Run once it answers, before anyone else talks to it (a JVM's request paths made hot).
    warm_up: fn(addr: SocketAddr) -> anyhow::Result<()>,
    /// The files and directories of its temporary directory that are its data.
    data: &'static [&'static str],
    /// How a crash ends it.
    crash: Crash,
    /// Make a fresh server what a built-in recipe's scenario expects of it (its tables, the
    /// `[backend]` settings the simulated server starts with).
    pub set_up: fn(addr: SocketAddr, backend: &Params) -> anyhow::Result<()>,
    /// For a server that runs as a cluster ([`Cluster`]): whether the member at `addr` leads it now.
    pub leads: Option<fn(addr: SocketAddr) -> bool>,
    /// How a cluster's members reach each other ([`Cluster`]).
    pub peer_links: PeerLinks,
    /// The pooler a scenario's `[backend]` puts in front of it, which its clients then reach instead
    /// (pgbouncer for PostgreSQL): started with [`Server::start_in_front`], after the set-up.
    pub front: fn(backend: &Params) -> Option<&'static Launcher>,
}

/// How a cluster's members reach each other: through proxies, so that a fault can cut one member off
/// from another while their clients still reach both, or directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerLinks {
    /// Directly (a server that runs alone).
    Direct,
    /// Through a proxy per pair of members: each member's configuration names an address of its own for
    /// each other member (ZooKeeper).
    PerPair,
    /// Through a proxy per member, in front of the port named, which tells each connection's source by
    /// its process: every member must name each member at one address alike (etcd, in front of its peer
    /// port; a Redis master, its replicas and Sentinels, in front of their one port).
    PerMember(Fronted),
}

/// The port of a member that its proxy stands in front of ([`PeerLinks::PerMember`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fronted {
    /// [`Ports::client`]: a server that takes its peers on its clients' port (Redis).
    Client,
    /// [`Ports::peer`].
    Peer,
}

/// The ports a server listens on, and for a cluster's member how it reaches the others.
#[derive(Debug, Clone)]
pub struct Ports {
    /// Its clients'.
    pub client: u16,
    /// A second port some servers need: etcd's peer port, a ZooKeeper member's quorum port.
    pub peer: u16,
    /// A third: a ZooKeeper member's election port.
    pub election: u16,
    /// A cluster's member: `None` for a server of its own.
    pub member: Option<Member>,
    /// A pooler's: the server it stands in front of.
    pub upstream: Option<Upstream>,
}

/// The server a pooler stands in front of, and the `[backend]` that configures the pooler.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub port: u16,
    pub backend: Params,
}

/// One member of a cluster, as its configuration says.
#[derive(Debug, Clone)]
pub struct Member {
    /// Its place in the cluster: `zk-1` is 1.
    pub index: usize,
    /// Where it reaches each member: the peer and the election port there, which are a proxy's when
    /// the launcher's [`Launcher::peer_links`] go through proxies (its own entry: its own ports, or
    /// with a proxy per member, its own proxy's).
    pub view: Vec<(u16, u16)>,
    /// The cluster's `[backend]` (a ZooKeeper ensemble's tickTime, syncLimit and initLimit).
    pub backend: Params,
}

/// How a crash ends a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// SIGKILL.
    Kill,
    /// SIGQUIT, PostgreSQL's immediate shutdown: every backend exits at once, nothing is written, and
    /// the next start recovers from the WAL (a SIGKILL of the postmaster would leave its backends).
    ImmediateShutdown,
}

impl Launcher {
    /// The launcher of `server`.
    pub fn of(server: &RealServer) -> &'static Launcher {
        let found = LAUNCHERS.iter().copied().find(|l| l.server == server);
        found.unwrap_or_else(|| panic!("every real server has a launcher, {} too", server.name))
    }

    /// How long it may take to answer after it starts.
    fn patience(&self) -> Duration {
        Duration::from_secs(30)
    }

    /// Nothing to warm up.
    fn cold(_: SocketAddr) -> anyhow::Result<()> {
        Ok(())
    }

    /// Nothing in front of it.
    fn alone(_: &Params) -> Option<&'static Launcher> {
        None
    }

    /// Nothing to set up.
    fn as_started(_: SocketAddr, _: &Params) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Where a server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr(pub SocketAddr);

/// One real server.
pub struct Server {
    launcher: &'static Launcher,
    addr: Addr,
    /// Its ports, kept across restarts.
    ports: Ports,
    /// `None` for a server locksim did not start.
    own: Option<Own>,
}

/// What locksim owns of a server it started.
struct Own {
    dir: ServerDir,
    child: Child,
    /// Crashed and not started again: `child` is reaped (its pid may belong to another process now).
    down: bool,
}

impl Server {
    /// Start `launcher`'s server in a fresh temporary directory on a free loopback port, and wait until it
    /// answers.
    pub fn start(launcher: &'static Launcher) -> anyhow::Result<Server> {
        Server::start_with(launcher, None)
    }

    /// Start `launcher`'s pooler in front of `upstream` as [`Server::start`] starts a server.
    pub fn start_in_front(launcher: &'static Launcher, upstream: Upstream) -> anyhow::Result<Server> {
        Server::start_with(launcher, Some(upstream))
    }

    fn start_with(launcher: &'static Launcher, upstream: Option<Upstream>) -> anyhow::Result<Server> {
        // A port found free may be taken before the server binds it (the kernel hands out the same
        // range to outgoing connections): on that clash, try again with other ports.
        const ATTEMPTS: u32 = 3;
        for attempt in 1.. {
            match Server::start_once(launcher, upstream.clone()) {
                Err(e) if attempt < ATTEMPTS && clash(&e) => continue,
                started => return started,
            }
        }
        unreachable!("the last attempt returns")
    }

    fn start_once(launcher: &'static Launcher, upstream: Option<Upstream>) -> anyhow::Result<Server> {
        let [client, peer, election] = free_ports()?;
        let mut server = Server::launch(launcher, Ports { client, peer, election, member: None, upstream })?;
        server.wait_ready()?;
        Ok(server)
    }

    /// Start `launcher`'s server on `ports` in a fresh temporary directory, without waiting for it.
    fn launch(launcher: &'static Launcher, ports: Ports) -> anyhow::Result<Server> {
        // Every server locksim starts, a cluster's members too, is stopped on Ctrl-C.
        on_interrupt_stop_everything();
        let dir = ServerDir::new(launcher)?;
        let addr = Addr(SocketAddr::from(([127, 0, 0, 1], ports.client)));
        let child = launch(launcher, dir.path(), &ports)?;
        Ok(Server { launcher, addr, ports, own: Some(Own { dir, child, down: false }) })
    }

    /// A server someone else runs at `addr`, if it answers there.
    pub fn external(launcher: &'static Launcher, addr: SocketAddr) -> anyhow::Result<Server> {
        if !ready(launcher, Addr(addr)) {
            anyhow::bail!("no {} answers at {addr}", launcher.program);
        }
        let ports = Ports { client: addr.port(), peer: 0, election: 0, member: None, upstream: None };
        Ok(Server { launcher, addr: Addr(addr), ports, own: None })
    }

    /// Its temporary directory (its working directory), for a server locksim started.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.own.as_ref().map(|o| o.dir.path())
    }

    pub fn launcher(&self) -> &'static Launcher {
        self.launcher
    }

    pub fn addr(&self) -> Addr {
        self.addr
    }

    /// Crashed by [`Server::crash`] and not started again.
    pub fn is_down(&self) -> bool {
        self.own.as_ref().is_some_and(|o| o.down)
    }

    /// Whether locksim runs it (and so can restart and stop it).
    pub fn is_own(&self) -> bool {
        self.own.is_some()
    }

    /// Kill the server (SIGKILL; PostgreSQL's immediate shutdown, SIGQUIT, which is its crash) and
    /// start it again on the same port, with its data (`keep`) or without; return once it answers.
    pub fn restart(&mut self, keep: bool) -> anyhow::Result<()> {
        self.crash()?;
        self.relaunch(keep)
    }

    /// Kill the server as [`Server::restart`] does, and leave it down (its port refuses connections)
    /// until [`Server::relaunch`].
    pub fn crash(&mut self) -> anyhow::Result<()> {
        let launcher = self.launcher;
        let own = self.own.as_mut().ok_or_else(|| anyhow::anyhow!("cannot crash a server locksim did not start"))?;
        if !own.down {
            crash(launcher, &mut own.child);
            own.down = true;
        }
        Ok(())
    }

    /// Start a crashed server again on the same port, with its data (`keep`) or without; return once
    /// it answers.
    pub fn relaunch(&mut self, keep: bool) -> anyhow::Result<()> {
        let launcher = self.launcher;
        let own = self.own.as_mut().ok_or_else(|| anyhow::anyhow!("cannot restart a server locksim did not start"))?;
        if !own.down {
            anyhow::bail!("{} is running: crash it before starting it again", launcher.program);
        }
        if !keep {
            wipe(launcher, own.dir.path())?;
        }
        own.child = launch(launcher, own.dir.path(), &self.ports)?;
        own.down = false;
        self.wait_ready()
    }

    /// Stop the server's processes (SIGSTOP: the server and, for PostgreSQL, every backend it forked)
    /// for `d`, then continue them (SIGCONT): a stop-the-world pause. The kernel still accepts
    /// connections and data meanwhile.
    pub fn pause(&mut self, d: Duration) -> anyhow::Result<()> {
        self.stop()?;
        std::thread::sleep(d);
        self.resume()
    }

    /// The first half of [`Server::pause`]: stop the server's processes until [`Server::resume`] (or
    /// a crash, or the drop, which continue them first).
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let pid = self.pid("stop")?;
        // The server first, so that it forks nothing new meanwhile.
        signal(pid, libc::SIGSTOP)?;
        children(pid).iter().for_each(|c| drop(signal(*c, libc::SIGSTOP)));
        Ok(())
    }

    /// Continue a server stopped by [`Server::stop`].
    pub fn resume(&mut self) -> anyhow::Result<()> {
        let pid = self.pid("continue")?;
        children(pid).iter().for_each(|c| drop(signal(*c, libc::SIGCONT)));
        signal(pid, libc::SIGCONT)
    }

    /// The running server's process id (`what`: the signal's purpose, for the error).
    fn pid(&self, what: &str) -> anyhow::Result<libc::pid_t> {
        match &self.own {
            None => anyhow::bail!("cannot {what} a server locksim did not start"),
            Some(own) if own.down => anyhow::bail!("cannot {what} {}: it is down", self.launcher.program),
            Some(own) => Ok(own.child.id() as libc::pid_t),
        }
    }

    /// Wait until the server answers and its warm-up has run to the end. A warm-up cut short (an
    /// ensemble member that drops its clients because it is electing again or still syncing with its
    /// leader, as a young or just restarted member on a busy machine does) is tried again until the
    /// launcher's patience runs out; then its error is the answer.
    pub(crate) fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.launcher.patience();
        let (program, addr) = (self.launcher.program, self.addr.0);
        loop {
            if ready(self.launcher, self.addr) {
                match (self.launcher.warm_up)(addr) {
                    Ok(()) => return Ok(()),
                    Err(e) if Instant::now() > deadline => {
                        return Err(e.context(format!("{program} at {addr}: warming up")))
                    }
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                }
            }
            if let Some(own) = &mut self.own {
                if let Some(status) = own.child.try_wait()? {
                    anyhow::bail!(
                        "{} exited ({status}) before it answered: {}",
                        self.launcher.program,
                        log_tail(own.dir.path())
                    );
                }
            }
            if Instant::now() > deadline {
                let log = self.own.as_ref().map_or(String::new(), |o| log_tail(o.dir.path()));
                anyhow::bail!(
                    "{} did not answer on {} within {:?}: {log}",
                    self.launcher.program,
                    self.addr.0,
                    self.launcher.patience()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(own) = self.own.as_mut().filter(|o| !o.down) {
            crash(self.launcher, &mut own.child);
        }
    }
}

/// Start `launcher`'s server in `dir`, its output to `dir/server.log`.
fn launch(launcher: &Launcher, dir: &Path, ports: &Ports) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("server.log"))?;
    let mut cmd = (launcher.launch)(dir, ports)?;
    cmd.current_dir(dir).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Its own process group: a Ctrl-C at the terminal reaches locksim, which stops it in order, and
    // not the server behind its back.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot start {}: {e}", launcher.program))?;
    remember(child.id());
    Ok(child)
}

/// Remove a stopped server's data, keeping its configuration and log.
fn wipe(launcher: &Launcher, dir: &Path) -> anyhow::Result<()> {
    for name in launcher.data {
        let path = dir.join(name);
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else if path.exists() {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Whether the server answers its simplest request.
fn ready(launcher: &Launcher, addr: Addr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr.0, Duration::from_millis(200)) else { return false };
    (launcher.ready)(stream, addr.0)
}

/// The program `name`: where the environment variable `LOCKSIM_<NAME>` says (e.g.
/// `LOCKSIM_REDIS_SERVER`, for another build), else on the PATH or at the Debian package's path.
fn binary(name: &str, known: &[&str]) -> anyhow::Result<PathBuf> {
    let var = format!("LOCKSIM_{}", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&var) {
        let path = PathBuf::from(path);
        return match path.is_file() {
            true => Ok(path),
            false => anyhow::bail!("{var}={}: no such program", path.display()),
        };
    }
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    on_path
        .map(|dir| dir.join(name))
        .chain(known.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} is not installed: run .ci/install-servers (Debian packages, as root)"))
}

/// Whether a server did not start because its port was taken (Redis, etcd, ZooKeeper and PostgreSQL
/// all say so in their log, which the error quotes).
fn clash(e: &anyhow::Error) -> bool {
    format!("{e:#}").to_ascii_lowercase().contains("address already in use")
}

/// `N` distinct free loopback ports (all bound at once, then let go for the server to take).
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N).map(|_| TcpListener::bind(("127.0.0.1", 0))).collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// [`process::signal`] to a server this process started and has not reaped, its error naming the call.
fn signal(pid: libc::pid_t, sig: libc::c_int) -> anyhow::Result<()> {
    process::signal(pid, sig).map_err(|e| anyhow::anyhow!("kill({pid}, {sig}): {e}"))
}

/// End a server as a crash would ([`Crash`]).
fn crash(launcher: &Launcher, child: &mut Child) {
    if launcher.crash == Crash::ImmediateShutdown && signal(child.id() as libc::pid_t, libc::SIGQUIT).is_ok() {
        resume(child.id() as libc::pid_t);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                forget(child.id());
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    kill(child);
}

fn kill(child: &mut Child) {
    resume(child.id() as libc::pid_t);
    let _ = child.kill();
    let _ = child.wait();
    forget(child.id());
}

/// Continue a server stopped by [`Server::pause`], and what it forked: a backend left stopped would
/// outlive its killed postmaster (continued, it sees the postmaster gone and exits).
fn resume(pid: libc::pid_t) {
    children(pid).into_iter().for_each(|c| drop(signal(c, libc::SIGCONT)));
    let _ = signal(pid, libc::SIGCONT);
}

/// SIGKILL a server and what it forked, and return once they are dead: kill(2) returns before the
/// signal is acted on, and a process still running meanwhile (Redis appending to its AOF, a PostgreSQL
/// backend) could write a file into the directory the interrupt handler is removing.
fn kill_and_wait(pid: libc::pid_t) {
    let forked = children(pid);
    resume(pid);
    let _ = signal(pid, libc::SIGKILL);
    forked.iter().for_each(|c| drop(signal(*c, libc::SIGKILL)));
    // Reaped here (locksim exits next), or already by the thread that started it: either way gone.
    // SAFETY: waitpid(2) on a child of this process, with a null status pointer.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while forked.iter().any(|c| alive(*c)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    if tail.is_empty() {
        "(its log is empty)".to_string()
    } else {
        format!("its log ends: {}", tail.join(" | "))
    }
}

/// Servers running now, for the interrupt handler: their process ids.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The directories of servers locksim started, until they are removed (a server's outlives its
/// process: a crashed server is started again in it, and a stopped one's is removed after its kill).
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn remember(pid: u32) {
    RUNNING.lock().expect("servers lock").push(pid);
}

fn forget(pid: u32) {
    RUNNING.lock().expect("servers lock").retain(|p| *p != pid);
}

/// A server's temporary directory, known to the interrupt handler until it is removed.
struct ServerDir(Option<tempfile::TempDir>);

impl ServerDir {
    fn new(launcher: &Launcher) -> anyhow::Result<ServerDir> {
        let dir = tempfile::Builder::new().prefix(&format!("locksim-{}-", launcher.program)).tempdir()?;
        DIRS.lock().expect("directories lock").push(dir.path().to_path_buf());
        Ok(ServerDir(Some(dir)))
    }

    fn path(&self) -> &Path {
        self.0.as_ref().expect("removed only on drop").path()
    }
}

impl Drop for ServerDir {
    /// Removed under the lock: an interrupt meanwhile waits for it rather than exit halfway through.
    fn drop(&mut self) {
        let mut dirs = DIRS.lock().expect("directories lock");
        if let Some(dir) = self.0.take() {
            dirs.retain(|d| d != dir.path());
            let _ = dir.close();
        }
    }
}

/// On Ctrl-C or SIGTERM: kill every server still running (and what real mode's client processes started),
/// remove its directory, exit 130.
fn on_interrupt_stop_everything() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            // A real run's client processes die with locksim; what they started, with these.
            crate::real::client::kill_all_marked();
            for pid in RUNNING.lock().expect("servers lock").drain(..) {
                kill_and_wait(pid as libc::pid_t);
            }
            for dir in DIRS.lock().expect("directories lock").drain(..) {
                let _ = std::fs::remove_dir_all(dir);
            }
            eprintln!("locksim: interrupted; the servers it started are stopped");
            std::process::exit(130);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_real_server_has_one_launcher_and_its_package_is_installed_by_the_repo_script() {
        let script = include_str!("../../../.ci/install-servers");
        for server in locksim_locks::REAL_SERVERS {
            let launchers = LAUNCHERS.iter().filter(|l| l.server == *server).count();
            assert_eq!(launchers, 1, "{}: one launcher", server.name);
            assert_eq!(Launcher::of(server).server, *server);
            assert!(script.contains(&format!("need+=({})", server.package)), "{}: .ci/install-servers", server.package);
        }
        assert_eq!(LAUNCHERS.len(), locksim_locks::REAL_SERVERS.len(), "no launcher of a server no family declares");
    }
}
