//! A private network namespace for one thread of client conformance: the real server and the real
//! client run in it, over its own loopback, and a cut is a pair of `blackhole` routing rules matching a
//! TCP port (`ip rule … ipproto tcp sport|dport P blackhole`). The kernel then drops that connection's
//! segments both ways: the sender retransmits into the void and keep-alive probes go unanswered, as
//! on a real network — and unlike a user-space proxy, whose own kernel would answer them. Healing
//! deletes the rules; the retransmission that follows delivers what was held.
//!
//! The namespace is made with `unshare(CLONE_NEWNET)` on the calling thread only, so the rest of the
//! process keeps the machine's network; the processes the thread starts (the server, a client
//! library's process, `ip` itself) inherit it. It needs root (`CAP_SYS_ADMIN`) and `ip` from iproute2;
//! it disappears with the last thread and process in it, so nothing outlives a run.
//!
//! Loopback traffic is routed by the `local` table, whose rule comes first (priority 0): it is moved
//! behind the cut rules (to `LOCAL_PRIORITY`), which only this namespace sees.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the `local` table's rule goes, so that cut rules (numbered below it) are looked at first.
const LOCAL_PRIORITY: u32 = 1000;

/// This thread's private network namespace.
pub struct Netns {
    /// The next free rule priority.
    next: AtomicU32,
}

/// A cut made by [`Netns::cut`]: its two rules.
#[derive(Debug)]
pub struct Cut {
    priorities: [u32; 2],
}

impl Netns {
    /// Move the calling thread into a new network namespace with loopback up. Everything the thread
    /// opens or starts from now on is in it.
    pub fn enter() -> anyhow::Result<Netns> {
        // SAFETY: unshare with CLONE_NEWNET changes only this thread's network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            let e = std::io::Error::last_os_error();
            anyhow::bail!("cannot make a network namespace (unshare: {e}): client conformance needs root");
        }
        ip(&["link", "set", "lo", "up"])?;
        ip(&["rule", "add", "priority", &LOCAL_PRIORITY.to_string(), "lookup", "local"])?;
        ip(&["rule", "del", "priority", "0", "lookup", "local"])?;
        Ok(Netns { next: AtomicU32::new(1) })
    }

    /// Drop every TCP segment from or to `port` (a server's port cuts all its connections; a client's
    /// local port cuts that one connection), until [`Netns::heal`].
    pub fn cut(&self, port: u16) -> anyhow::Result<Cut> {
        let first = self.next.fetch_add(2, Ordering::SeqCst);
        assert!(first + 2 < LOCAL_PRIORITY, "more cuts than rule priorities");
        let port = port.to_string();
        for (priority, end) in [(first, "sport"), (first + 1, "dport")] {
            ip(&["rule", "add", "priority", &priority.to_string(), "ipproto", "tcp", end, &port, "blackhole"])?;
        }
        Ok(Cut { priorities: [first, first + 1] })
    }

    /// End a cut: what TCP held is delivered at its next retransmission.
    pub fn heal(&self, cut: Cut) -> anyhow::Result<()> {
        for priority in cut.priorities {
            ip(&["rule", "del", "priority", &priority.to_string()])?;
        }
        Ok(())
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run `ip` (iproute2; run .ci/install-servers): {e}"))?;
    if !out.status.success() {
        anyhow::bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// Root and `ip` are needed; without them (a developer's machine) the test says so and passes,
    /// unless `LOCKSIM_REQUIRE_SERVERS` asks for everything.
    fn enter() -> Option<Netns> {
        match Netns::enter() {
            Ok(net) => Some(net),
            Err(e) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
                eprintln!("skipped: {e:#}");
                None
            }
            Err(e) => panic!("{e:#}"),
        }
    }

    #[test]
    fn a_cut_holds_a_connections_data_until_a_retransmission_after_the_heal() {
        std::thread::spawn(|| {
            let Some(net) = enter() else { return };
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (mut server, _) = listener.accept().unwrap();
            server.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let cut = net.cut(port).unwrap();
            let sent = Instant::now();
            client.write_all(b"x").unwrap();
            let mut byte = [0u8];
            assert!(server.read(&mut byte).is_err(), "nothing crosses a cut");
            net.heal(cut).unwrap();
            server.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            assert_eq!(server.read(&mut byte).unwrap(), 1, "delivered after the heal");
            // Retransmitted at 0.2, 0.6 s …: the first one after the heal at 0.5 s is at 0.6 s.
            assert!(sent.elapsed() >= Duration::from_millis(550), "by a retransmission: {:?}", sent.elapsed());
        })
        .join()
        .unwrap();
        // The namespace was the thread's: this thread still reaches the machine's loopback as before.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    }
}
