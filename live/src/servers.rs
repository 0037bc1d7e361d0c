//! Real servers on loopback, started by locksim from the Debian packages `.ci/install-servers`
//! installs: each in its own temporary directory (data, configuration, logs) on a free port, waited for
//! until it answers, and stopped at the end — on success, on an error, on a panic, and on Ctrl-C or
//! SIGTERM (a handler kills every server still running and removes its directory). Nothing is written
//! outside the temporary directory. Or `--server HOST:PORT` points at one already running; locksim then
//! neither restarts nor stops it: scripts are played without their restarts and stops.

use crate::process::{self, alive, children};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The ZooKeeper server's tickTime (the `zoo.cfg` this launcher writes): sessions are negotiated into
/// [400 ms, 4 s].
pub const ZK_TICK_MS: u64 = 200;

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `redis-server` 7.0 (Debian 12 `redis-server`).
    Redis,
    /// `etcd` 3.4, one member (Debian 12 `etcd-server`).
    Etcd,
    /// ZooKeeper 3.8, standalone (Debian 12 `zookeeper`), tickTime 200 ms.
    ZooKeeper,
    /// PostgreSQL 15 (Debian 12 `postgresql-15`), a cluster of its own made by `initdb`.
    Postgres,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Redis => "redis-server",
            Kind::Etcd => "etcd",
            Kind::ZooKeeper => "zookeeper",
            Kind::Postgres => "postgres",
        }
    }

    /// How long it may take to answer after it starts.
    fn patience(self) -> Duration {
        match self {
            Kind::Redis | Kind::Etcd | Kind::ZooKeeper | Kind::Postgres => Duration::from_secs(30),
        }
    }
}

/// Where a server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr(pub SocketAddr);

/// One real server.
pub struct Server {
    kind: Kind,
    addr: Addr,
    /// A second port some servers need (etcd's peer port), kept across restarts.
    peer_port: u16,
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
    /// Start a `kind` server in a fresh temporary directory on a free loopback port, and wait until it
    /// answers.
    pub fn start(kind: Kind) -> anyhow::Result<Server> {
        on_interrupt_stop_everything();
        // A port found free may be taken before the server binds it (the kernel hands out the same
        // range to outgoing connections): on that clash, try again with other ports.
        const ATTEMPTS: u32 = 3;
        for attempt in 1.. {
            match Server::start_once(kind) {
                Err(e) if attempt < ATTEMPTS && clash(&e) => continue,
                started => return started,
            }
        }
        unreachable!("the last attempt returns")
    }

    fn start_once(kind: Kind) -> anyhow::Result<Server> {
        let dir = ServerDir::new(kind)?;
        let (port, peer_port) = free_ports()?;
        let addr = Addr(SocketAddr::from(([127, 0, 0, 1], port)));
        let child = launch(kind, dir.path(), port, peer_port)?;
        let mut server = Server { kind, addr, peer_port, own: Some(Own { dir, child, down: false }) };
        server.wait_ready()?;
        Ok(server)
    }

    /// A server someone else runs at `addr`, if it answers there.
    pub fn external(kind: Kind, addr: SocketAddr) -> anyhow::Result<Server> {
        if !ready(kind, Addr(addr)) {
            anyhow::bail!("no {} answers at {addr}", kind.name());
        }
        Ok(Server { kind, addr: Addr(addr), peer_port: 0, own: None })
    }

    pub fn kind(&self) -> Kind {
        self.kind
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
        let kind = self.kind;
        let own = self.own.as_mut().ok_or_else(|| anyhow::anyhow!("cannot crash a server locksim did not start"))?;
        if !own.down {
            crash(kind, &mut own.child);
            own.down = true;
        }
        Ok(())
    }

    /// Start a crashed server again on the same port, with its data (`keep`) or without; return once
    /// it answers.
    pub fn relaunch(&mut self, keep: bool) -> anyhow::Result<()> {
        let kind = self.kind;
        let own = self.own.as_mut().ok_or_else(|| anyhow::anyhow!("cannot restart a server locksim did not start"))?;
        if !own.down {
            anyhow::bail!("{} is running: crash it before starting it again", kind.name());
        }
        if !keep {
            wipe(kind, own.dir.path())?;
        }
        own.child = launch(kind, own.dir.path(), self.addr.0.port(), self.peer_port)?;
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
            Some(own) if own.down => anyhow::bail!("cannot {what} {}: it is down", self.kind.name()),
            Some(own) => Ok(own.child.id() as libc::pid_t),
        }
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.kind.patience();
        loop {
            if ready(self.kind, self.addr) {
                return warm_up(self.kind, self.addr);
            }
            if let Some(own) = &mut self.own {
                if let Some(status) = own.child.try_wait()? {
                    anyhow::bail!(
                        "{} exited ({status}) before it answered: {}",
                        self.kind.name(),
                        log_tail(own.dir.path())
                    );
                }
            }
            if Instant::now() > deadline {
                let log = self.own.as_ref().map_or(String::new(), |o| log_tail(o.dir.path()));
                anyhow::bail!(
                    "{} did not answer on {} within {:?}: {log}",
                    self.kind.name(),
                    self.addr.0,
                    self.kind.patience()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(own) = self.own.as_mut().filter(|o| !o.down) {
            crash(self.kind, &mut own.child);
        }
    }
}

/// The program, its arguments and its directory layout for each kind.
fn launch(kind: Kind, dir: &Path, port: u16, peer_port: u16) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("server.log"))?;
    let mut cmd = match kind {
        Kind::Redis => {
            // Persistence by AOF: Redis write()s the AOF before it replies, so a killed process loses
            // no acknowledged write (the kernel has it; fsync matters only when the machine dies), as
            // the model's `persist = true` assumes — and `appendfsync no` keeps a write from waiting
            // on the disk. No RDB snapshots, no protected mode; `hz 100` so that a `WAIT` times out
            // within 10 ms of its time rather than 100.
            let mut cmd = Command::new(binary("redis-server", &["/usr/bin/redis-server"])?);
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
                .arg(dir)
                .args(["--appendonly", "yes", "--appendfsync", "no", "--save", "", "--daemonize", "no", "--hz", "100"])
                .args(["--protected-mode", "no", "--logfile", ""]);
            cmd
        }
        Kind::Etcd => {
            let (client, peer) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{peer_port}"));
            let mut cmd = Command::new(binary("etcd", &["/usr/bin/etcd"])?);
            cmd.args(["--name", "locksim", "--data-dir"])
                .arg(dir.join("data"))
                .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &format!("locksim={peer}")]);
            cmd
        }
        Kind::ZooKeeper => {
            // Standalone, as Debian's zkServer.sh runs it, from a zoo.cfg of our own: no admin server,
            // only `ruok` and `srvr` of the four-letter words, and no logging (slf4j finds no binding
            // on the class path, so nothing is written outside the directory).
            let jar =
                ["/usr/share/java/zookeeper.jar"].into_iter().find(|p| Path::new(p).is_file()).ok_or_else(|| {
                    anyhow::anyhow!("zookeeper is not installed: run .ci/install-servers (Debian packages, as root)")
                })?;
            let cfg = dir.join("zoo.cfg");
            let data = dir.join("data");
            std::fs::create_dir_all(&data)?;
            std::fs::write(
                &cfg,
                format!(
                    "tickTime={}\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                     admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n",
                    ZK_TICK_MS,
                    data.display()
                ),
            )?;
            let mut cmd = Command::new(binary("java", &["/usr/bin/java"])?);
            cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", jar])
                .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
                .arg(&cfg);
            cmd
        }
        Kind::Postgres => postgres(dir, port)?,
    };
    cmd.current_dir(dir).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Its own process group: a Ctrl-C at the terminal reaches locksim, which stops it in order, and
    // not the server behind its back.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot start {}: {e}", kind.name()))?;
    remember(child.id());
    Ok(child)
}

/// Remove a stopped server's data, keeping its configuration and log.
fn wipe(kind: Kind, dir: &Path) -> anyhow::Result<()> {
    let data: &[&str] = match kind {
        Kind::Redis => &["appendonlydir", "dump.rdb"],
        Kind::Etcd | Kind::ZooKeeper | Kind::Postgres => &["data"],
    };
    for name in data {
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
fn ready(kind: Kind, addr: Addr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr.0, Duration::from_millis(200)) else { return false };
    match kind {
        Kind::Redis => {
            let mut conn = crate::wire::resp::Conn::on(stream);
            matches!(conn.command(&["PING"]), Ok(crate::wire::resp::Value::Simple(s)) if s == "PONG")
        }
        // A read needs a leader: the server is up and serving.
        Kind::Etcd => crate::wire::http::post(addr.0, "/v3/kv/range", r#"{"key":"AA=="}"#).is_ok(),
        // A session: the server has loaded its data and serves.
        Kind::ZooKeeper => match crate::wire::jute::Conn::connect(addr.0, 4000, None) {
            Ok(Ok(mut conn)) => conn.call(crate::wire::jute::CLOSE_SESSION, crate::wire::jute::Body::default()).is_ok(),
            _ => false,
        },
        Kind::Postgres => crate::wire::pgwire::Conn::connect(addr.0, Duration::from_millis(200))
            .is_ok_and(|mut c| c.query("SELECT 1").is_ok_and(|r| r.error.is_none())),
    }
}

/// Run a freshly started JVM's request paths a few hundred times, so that a script's first requests
/// after a (re)start are not answered late by a cold JIT (which would make the seed inconclusive).
fn warm_up(kind: Kind, addr: Addr) -> anyhow::Result<()> {
    use crate::wire::jute::{Body, Conn, CLOSE_SESSION, CREATE2, DELETE, EXISTS, GET_CHILDREN2, PING};
    if kind != Kind::ZooKeeper {
        return Ok(());
    }
    let Ok(mut conn) = Conn::connect(addr.0, 4000, None)? else { anyhow::bail!("ZooKeeper refused a session") };
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

/// Two distinct free loopback ports (both bound at once, then let go for the server to take).
fn free_ports() -> anyhow::Result<(u16, u16)> {
    let (a, b) = (TcpListener::bind(("127.0.0.1", 0))?, TcpListener::bind(("127.0.0.1", 0))?);
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// [`process::signal`] to a server this process started and has not reaped, its error naming the call.
fn signal(pid: libc::pid_t, sig: libc::c_int) -> anyhow::Result<()> {
    process::signal(pid, sig).map_err(|e| anyhow::anyhow!("kill({pid}, {sig}): {e}"))
}

/// End a server as a crash would: SIGKILL, or for PostgreSQL an immediate shutdown (SIGQUIT: every
/// backend exits at once, nothing is written, and the next start recovers from the WAL), which also
/// ends the backends a SIGKILL of the postmaster would leave behind.
fn crash(kind: Kind, child: &mut Child) {
    if kind == Kind::Postgres && signal(child.id() as libc::pid_t, libc::SIGQUIT).is_ok() {
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

/// PostgreSQL: a cluster made by `initdb` in `dir/data` on the first start (trust authentication,
/// as the `postgres` user when locksim runs as root, since PostgreSQL refuses to run as root), then
/// the server on loopback only. `fsync` is off: it costs time and changes nothing a script can see
/// (the kernel keeps what a killed process wrote), while `synchronous_commit` stays on, or a crash
/// would lose transactions committed in the last few hundred milliseconds; no checkpoints on a timer, so
/// that what a sequence logs ahead (and so skips after a crash) does not depend on when a script runs.
fn postgres(dir: &Path, port: u16) -> anyhow::Result<Command> {
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
fn postgres_user(dir: &Path) -> anyhow::Result<Option<(u32, u32)>> {
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

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(cmd, uid);
        std::os::unix::process::CommandExt::gid(cmd, gid);
    }
    cmd
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
    fn new(kind: Kind) -> anyhow::Result<ServerDir> {
        let dir = tempfile::Builder::new().prefix(&format!("locksim-{}-", kind.name())).tempdir()?;
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
