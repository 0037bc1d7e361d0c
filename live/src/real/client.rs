//! One client process: started from the recipe's command, spoken to in JSON lines, stopped, continued
//! and killed by the faults, and always killed and reaped when dropped.
//!
//! A reader thread turns the process's stdout into [`Line`]s on a channel, so that the workload can
//! wait for an answer with a deadline; another keeps the last lines of its stderr for error messages;
//! a third watches the process itself (a pidfd, else `waitid`) and puts [`Line::Exited`] on the same
//! channel the moment it ends — even while something it started still holds its stdout open.
//!
//! The process leads its own process group, which faults and the final kill signal as a whole, and
//! gets `PR_SET_PDEATHSIG` = SIGKILL, so it dies with locksim however locksim ends (Ctrl-C included).
//! What it starts that leaves the group (a daemon's `setsid`) is found by its environment: every process
//! gets [`ENV_MARK`] = `<locksim's pid>.<n>`, which its descendants inherit, and when the process is
//! dropped every live process carrying its mark is killed too ([`kill_marked`]; on Ctrl-C, every mark of
//! this locksim: [`kill_all_marked`]). This needs no privilege (no cgroup or PID namespace); a
//! descendant that clears its environment and leaves the group escapes it.

use super::protocol::{parse, Message, ProtocolError, Request};
use crate::process::{self, die_with_parent};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest line a client may write (bytes); a longer one is a protocol error.
const LINE_MAX: u64 = 64 * 1024;
/// How many lines of a client's stderr are kept for an error message.
const STDERR_KEPT: usize = 20;
/// The variable that marks a client process and everything it starts (see the module doc).
pub const ENV_MARK: &str = "LOCKSIM_PROCESS_MARK";
/// How many times [`kill_marked`] looks again for marked processes (a descendant may fork meanwhile).
const KILL_ROUNDS: usize = 20;
/// How long an error message waits for the rest of a dead process's stderr (its end, at once, unless a
/// descendant still holds it open).
const STDERR_GRACE: Duration = Duration::from_secs(1);

/// What came from a client's stdout.
#[derive(Debug)]
pub enum Line {
    Message(Message),
    Bad(ProtocolError),
    /// Its stdout closed (the process ended, or closed it).
    Closed,
    /// The process ended, with this status (`exit status: 3`, `signal: 9 (SIGKILL)`).
    Exited(String),
}

/// What the process is started with.
pub struct Spawn<'a> {
    pub client: &'a str,
    pub argv: &'a [String],
    /// The scenario file's directory: the working directory, and where a relative program is found.
    pub dir: &'a Path,
    pub env: &'a [(String, String)],
}

pub struct ClientProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    stderr: Arc<Stderr>,
    /// Its [`ENV_MARK`] value.
    mark: String,
    /// How it ended, once [`Line::Exited`] said so.
    status: Option<String>,
    reaped: bool,
}

/// The last lines of a process's stderr, and whether it has closed.
#[derive(Default)]
struct Stderr {
    state: Mutex<(VecDeque<String>, bool)>,
    closed: Condvar,
}

impl ClientProcess {
    pub fn spawn(s: &Spawn) -> anyhow::Result<ClientProcess> {
        let (program, args) = s.argv.split_first().ok_or_else(|| anyhow::anyhow!("{}: empty command", s.client))?;
        // A program named with a path is found relative to the scenario file; a bare name on PATH.
        let program = if program.contains('/') { s.dir.join(program) } else { program.into() };
        let mut cmd = Command::new(&program);
        cmd.args(args).current_dir(s.dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.envs(s.env.iter().map(|(k, v)| (k, v)));
        let mark = new_mark();
        cmd.env(ENV_MARK, &mark);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            anyhow::anyhow!("{}: cannot start {} (in {}): {e}", s.client, program.display(), s.dir.display())
        })?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            kill_and_reap(&mut child, &mark);
            anyhow::bail!("{}: the command's stdout or stderr was not piped", s.client);
        };
        let (tx, lines) = std::sync::mpsc::channel();
        // Opened before anything can reap the process, so that it names this process and no other.
        let pidfd = pidfd_open(child.id() as libc::pid_t);
        let (pid, exits) = (child.id() as libc::pid_t, tx.clone());
        std::thread::spawn(move || watch_exit(pid, pidfd, &exits));
        let client = s.client.to_string();
        std::thread::spawn(move || read_lines(&client, stdout, &tx));
        let kept = Arc::new(Stderr::default());
        let keep = kept.clone();
        std::thread::spawn(move || keep_stderr(stderr, &keep));
        let stdin = child.stdin.take();
        let name = s.client.to_string();
        Ok(ClientProcess { name, child, stdin, lines, stderr: kept, mark, status: None, reaped: false })
    }

    pub fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Send a request; false when the process is gone (its stdin closed).
    pub fn send(&mut self, request: Request) -> bool {
        let Some(stdin) = self.stdin.as_mut() else { return false };
        let sent = stdin.write_all(request.line().as_bytes()).and_then(|()| stdin.flush());
        if sent.is_err() {
            self.stdin = None;
        }
        sent.is_ok()
    }

    /// The next line, or `None` at `deadline`.
    pub fn next(&mut self, deadline: Instant) -> Option<Line> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let line = match self.lines.recv_timeout(wait) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => return None,
            Err(RecvTimeoutError::Disconnected) => Line::Closed,
        };
        if let Line::Exited(status) = &line {
            self.status = Some(status.clone());
        }
        Some(line)
    }

    /// Why the process ended, with the last lines of its stderr (for a harness error); `waiting`: the
    /// request it left unanswered, if any.
    pub fn death(&mut self, waiting: Option<&str>) -> String {
        // Its stdout closed, or it exited: give it a moment to say how (a closed stdout comes first).
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.status.is_none() && Instant::now() < deadline {
            match self.next(deadline) {
                None => break,
                // The channel may stay closed: wait for the status without spinning.
                Some(Line::Closed) => std::thread::sleep(Duration::from_millis(10)),
                Some(_) => {}
            }
        }
        let what = match &self.status {
            Some(status) => format!("the command ended ({status})"),
            None => "the command closed its stdout and runs on".to_string(),
        };
        let waiting = waiting.map_or(String::new(), |r| format!(" while locksim waited for its answer to {r}"));
        format!("{}: {what}{waiting}; {}", self.name, self.stderr_tail())
    }

    /// "its stderr ends: ..." with its last lines — all of them once it closed, or after a moment (a
    /// descendant may hold it open).
    pub fn stderr_tail(&self) -> String {
        let state = self.stderr.state.lock().expect("stderr lock");
        let (state, _) =
            self.stderr.closed.wait_timeout_while(state, STDERR_GRACE, |(_, closed)| !*closed).expect("stderr lock");
        let tail: Vec<&str> = state.0.iter().map(String::as_str).collect();
        match tail.is_empty() {
            true => "nothing on its stderr".to_string(),
            false => format!("its stderr ends:\n    {}", tail.join("\n    ")),
        }
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        if !self.reaped {
            self.stdin = None;
            kill_and_reap(&mut self.child, &self.mark);
            self.reaped = true;
        }
    }
}

/// SIGKILL to the process and its group (whatever it started), and to every process carrying its
/// `mark` (what left the group), then wait for it.
fn kill_and_reap(child: &mut Child, mark: &str) {
    // The child is not reaped yet (wait below), so its pid (the group's id) is still ours.
    let _ = process::signal_group(child.id() as libc::pid_t, libc::SIGKILL);
    let _ = child.kill();
    let left = kill_marked(&|m| m == mark);
    if left > 0 {
        eprintln!("locksim: {left} processes marked {ENV_MARK}={mark} still ran after {KILL_ROUNDS} rounds of SIGKILL");
    }
    let _ = child.wait();
}

/// A mark no other client process of this locksim has had.
fn new_mark() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// SIGKILL every live process (but this one) whose [`ENV_MARK`] satisfies `marked`, looking again
/// until none is left or 20 rounds have passed; how many were still found in the last round.
pub fn kill_marked(marked: &dyn Fn(&str) -> bool) -> usize {
    let mut found = 0;
    for _ in 0..KILL_ROUNDS {
        let pids = marked_processes(marked);
        found = pids.len();
        if found == 0 {
            return 0;
        }
        for pid in pids {
            // Just read from /proc with our mark; at worst it has ended meanwhile.
            let _ = process::signal(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    found
}

/// On Ctrl-C: SIGKILL everything any client process of this locksim started.
pub fn kill_all_marked() {
    let ours = format!("{}.", std::process::id());
    kill_marked(&|m| m.starts_with(&ours));
}

/// Live processes (not zombies, not this one) whose environment has a mark `marked` accepts.
fn marked_processes(marked: &dyn Fn(&str) -> bool) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id() as libc::pid_t;
    let prefix = format!("{ENV_MARK}=");
    let mut pids = Vec::new();
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok()) {
        if pid == me {
            continue;
        }
        // Another user's process, or one gone meanwhile: not ours.
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let ours = environ
            .split(|b| *b == 0)
            .any(|v| v.strip_prefix(prefix.as_bytes()).and_then(|m| std::str::from_utf8(m).ok()).is_some_and(marked));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
        if ours && !zombie {
            pids.push(pid);
        }
    }
    pids
}

/// A pidfd for `pid` (Linux 5.3), or -1.
fn pidfd_open(pid: libc::pid_t) -> libc::c_int {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor (or -1).
    unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) as libc::c_int }
}

/// Wait until the process ends, without reaping it (its pid, the group's id, stays ours to signal until
/// `Drop` reaps it), and send [`Line::Exited`] with its status. Through its pidfd when there is one.
fn watch_exit(pid: libc::pid_t, pidfd: libc::c_int, tx: &Sender<Line>) {
    // SAFETY: siginfo_t is plain data, and zero is a valid value of it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let (idtype, id) = if pidfd >= 0 { (libc::P_PIDFD, pidfd as libc::id_t) } else { (libc::P_PID, pid as libc::id_t) };
    let waited = loop {
        // SAFETY: waitid(2) with a valid out-pointer; WNOWAIT leaves the process to be reaped by `Drop`.
        let r = unsafe { libc::waitid(idtype, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break r == 0;
        }
    };
    if pidfd >= 0 {
        // SAFETY: our own descriptor, closed once.
        unsafe {
            libc::close(pidfd);
        }
    }
    // Reaped by `Drop` already (ECHILD): nobody is listening.
    if waited {
        let _ = tx.send(Line::Exited(exit_status(&info)));
    }
}

/// A `waitid` result in words, as `std::process::ExitStatus` shows it.
fn exit_status(info: &libc::siginfo_t) -> String {
    // SAFETY: waitid filled in a child's exit: si_status is the field for CLD_* codes.
    let status = unsafe { info.si_status() };
    match info.si_code {
        libc::CLD_EXITED => format!("exit status: {status}"),
        libc::CLD_DUMPED => format!("signal: {status} (core dumped)"),
        _ => format!("signal: {status}"),
    }
}

fn read_lines(client: &str, stdout: impl Read, tx: &std::sync::mpsc::Sender<Line>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut bytes = Vec::new();
        let read = (&mut reader).take(LINE_MAX + 1).read_until(b'\n', &mut bytes);
        let line = match read {
            Ok(0) | Err(_) => {
                let _ = tx.send(Line::Closed);
                return;
            }
            Ok(_) if bytes.len() as u64 > LINE_MAX => {
                let why = format!("a line longer than {LINE_MAX} bytes");
                let text = String::from_utf8_lossy(&bytes[..200]).into_owned();
                Line::Bad(ProtocolError { client: client.to_string(), line: text, why })
            }
            Ok(_) => match std::str::from_utf8(&bytes) {
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => parse(client, text).map_or_else(Line::Bad, Line::Message),
                Err(_) => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    Line::Bad(ProtocolError { client: client.to_string(), line: text, why: "not UTF-8".into() })
                }
            },
        };
        if tx.send(line).is_err() {
            return;
        }
    }
}

fn keep_stderr(stderr: impl Read, kept: &Stderr) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let Ok(mut state) = kept.state.lock() else { return };
        if state.0.len() == STDERR_KEPT {
            state.0.pop_front();
        }
        state.0.push_back(line);
    }
    if let Ok(mut state) = kept.state.lock() {
        state.1 = true;
        kept.closed.notify_all();
    }
}
