//! Process control for the real servers and client processes: signals by kill(2), the processes a
//! server forked, and children that die with locksim. The launcher ([`crate::servers`]), conformance
//! and real mode all signal through here.

use std::process::Command;

/// Send `sig` to the process `pid`.
pub fn signal(pid: libc::pid_t, sig: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain kill(2); callers name a child of this process not reaped yet, or a process just read
    // from /proc (at worst it has ended meanwhile: ESRCH, as a pid is not reused while its zombie
    // waits for its parent).
    match unsafe { libc::kill(pid, sig) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Send `sig` to the process group `leader` leads (a child started by [`die_with_parent`]'s command:
/// the process and whatever it started).
pub fn signal_group(leader: libc::pid_t, sig: libc::c_int) -> std::io::Result<()> {
    signal(-leader, sig)
}

/// Whether `pid` runs (a zombie does not: it holds no file open).
pub fn alive(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// The processes `pid` forked (PostgreSQL's backends and workers), from `/proc`.
pub fn children(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let parent = |stat: &str| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok().and_then(|s| parent(&s)) == Some(pid))
        .collect()
}

/// The child leads a process group of its own (a fault signals the whole group: the adapter and
/// anything it started), and gets SIGKILL when locksim dies (Linux `PR_SET_PDEATHSIG`).
pub fn die_with_parent(cmd: &mut Command) {
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
