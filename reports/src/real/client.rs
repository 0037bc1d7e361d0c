//! One client process: started from the recipe's command, spoken to in JSON lines, stopped, continued
//! and killed by the faults, and always killed and reaped when dropped.
//!
//! A reader thread turns the process's stdout into [`Line`]s on a channel, so that the workload can
//! wait for an answer with a deadline; another keeps the last lines of its stderr for error messages.
//! The process leads its own process group, which faults and the final kill signal as a whole, and
//! gets `PR_SET_PDEATHSIG` = SIGKILL, so it dies with locksim however locksim ends (Ctrl-C included).

use super::protocol::{parse, Message, ProtocolError, Request};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The longest line a client may write (bytes); a longer one is a protocol error.
const LINE_MAX: u64 = 64 * 1024;
/// How many lines of a client's stderr are kept for an error message.
const STDERR_KEPT: usize = 20;

/// What came from a client's stdout.
#[derive(Debug)]
pub enum Line {
    Message(Message),
    Bad(ProtocolError),
    /// Its stdout closed: the process ended (or was killed).
    Closed,
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
    stderr: Arc<Mutex<VecDeque<String>>>,
    reaped: bool,
}

impl ClientProcess {
    pub fn spawn(s: &Spawn) -> anyhow::Result<ClientProcess> {
        let (program, args) = s.argv.split_first().ok_or_else(|| anyhow::anyhow!("{}: empty command", s.client))?;
        // A program named with a path is found relative to the scenario file; a bare name on PATH.
        let program = if program.contains('/') { s.dir.join(program) } else { program.into() };
        let mut cmd = Command::new(&program);
        cmd.args(args).current_dir(s.dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.envs(s.env.iter().map(|(k, v)| (k, v)));
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            anyhow::anyhow!("{}: cannot start {} (in {}): {e}", s.client, program.display(), s.dir.display())
        })?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            kill_and_reap(&mut child);
            anyhow::bail!("{}: the command's stdout or stderr was not piped", s.client);
        };
        let (tx, lines) = std::sync::mpsc::channel();
        let client = s.client.to_string();
        std::thread::spawn(move || read_lines(&client, stdout, &tx));
        let kept = Arc::new(Mutex::new(VecDeque::new()));
        let keep = kept.clone();
        std::thread::spawn(move || keep_stderr(stderr, &keep));
        let stdin = child.stdin.take();
        Ok(ClientProcess { name: s.client.to_string(), child, stdin, lines, stderr: kept, reaped: false })
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
    pub fn next(&self, deadline: Instant) -> Option<Line> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Line::Closed),
        }
    }

    /// Why the process ended, with the last lines of its stderr (for a harness error).
    pub fn death(&mut self) -> String {
        // Its stdout closed: give it a moment to exit before asking.
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
                Ok(None) => break "closed its stdout".to_string(),
                Err(e) => break format!("unknown status ({e})"),
            }
        };
        let tail: Vec<String> = self.stderr.lock().map(|l| l.iter().cloned().collect()).unwrap_or_default();
        let tail = if tail.is_empty() { "(nothing on stderr)".to_string() } else { tail.join("\n    ") };
        format!("{}: the command ended ({status}); its stderr ends:\n    {tail}", self.name)
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        if !self.reaped {
            self.stdin = None;
            kill_and_reap(&mut self.child);
            self.reaped = true;
        }
    }
}

/// SIGKILL to the process and its group (whatever it started), then wait for it.
fn kill_and_reap(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's group; the child is not reaped yet (wait below), so its pid
    // (the group's id) is still ours.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The child leads a process group of its own (a fault signals the whole group: the adapter and
/// anything it started), and gets SIGKILL when locksim dies (Linux `PR_SET_PDEATHSIG`).
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
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

fn keep_stderr(stderr: impl Read, kept: &Mutex<VecDeque<String>>) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { return };
        let Ok(mut kept) = kept.lock() else { return };
        if kept.len() == STDERR_KEPT {
            kept.pop_front();
        }
        kept.push_back(line);
    }
}
