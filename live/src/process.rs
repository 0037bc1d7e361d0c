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

/// The process at the other end of `stream`, a loopback connection accepted here, as `which` knows it:
/// the first process `which` names (`Some`) that holds the connecting socket — found by its ports in
/// `/proc/net/tcp` (or `tcp6`), whose inode names the socket, and by that inode among the process's
/// open files. `None` when no process `which` knows holds it.
pub fn connected_from<T>(stream: &std::net::TcpStream, which: impl Fn(libc::pid_t) -> Option<T>) -> Option<T> {
    let (here, there) = (stream.local_addr().ok()?, stream.peer_addr().ok()?);
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|table| socket_inode(&table, there.port(), here.port()))?;
    let socket = format!("socket:[{inode}]");
    let entries = std::fs::read_dir("/proc").ok()?;
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok());
    pids.filter_map(|pid| Some((pid, which(pid)?))).find_map(|(pid, known)| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        let mut links = fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok());
        links.any(|l| l.as_os_str() == socket.as_str()).then_some(known)
    })
}

/// The inode of the socket in `table` (`/proc/net/tcp`'s text) whose local port is `local` and whose
/// remote port is `remote` (both on loopback here, so the ports alone tell it).
fn socket_inode(table: &str, local: u16, remote: u16) -> Option<u64> {
    let port = |addr: &str| addr.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (l, r, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        (port(l)? == local && port(r)? == remote).then(|| inode.parse().ok()).flatten()
    })
}

/// The working directory of process `pid` (a server's is its temporary directory).
pub fn cwd(pid: libc::pid_t) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_at_the_other_end_of_a_loopback_connection_is_found_by_its_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _dialed = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let me = std::process::id() as libc::pid_t;
        assert_eq!(connected_from(&accepted, |pid| (pid == me).then_some("locksim")), Some("locksim"));
        assert_eq!(connected_from(&accepted, |pid| (pid != me).then_some("another")), None);
    }

    #[test]
    fn a_socket_is_told_by_its_local_and_remote_ports() {
        let table =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
                     0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n   \
                     1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n   \
                     2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 333 1\n";
        assert_eq!(socket_inode(table, 0xD431, 0x1F90), Some(222));
        assert_eq!(socket_inode(table, 0x1F90, 0xD431), Some(333));
        assert_eq!(socket_inode(table, 0xD431, 0x1F91), None);
    }
}
