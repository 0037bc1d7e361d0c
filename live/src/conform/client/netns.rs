//! A private network namespace for one thread of client conformance: the real server and the real
//! client run in it, over its own loopback, and a cut drops a TCP port's segments as they arrive
//! (an nftables `input` rule matching `tcp sport|dport` against a set of cut ports). The sender's
//! kernel has sent them, so they are lost as on a real network: it retransmits on its backed-off
//! timer and keep-alive probes go unanswered — unlike a user-space proxy, whose own kernel would
//! answer them, and unlike a rule on the way *out* (a `blackhole` route, an `output` drop), which fails
//! the send inside the sender's kernel: the data then stays unsent rather than in flight, and goes
//! with the next write after the heal instead of at a retransmission. Healing takes the port out of
//! the set; the retransmission that follows delivers what was held.
//!
//! The namespace is made with `unshare(CLONE_NEWNET)` on the calling thread only, so the rest of the
//! process keeps the machine's network; the processes the thread starts (the server, a client
//! library's process, `ip` and `nft` themselves) inherit it. It needs root (`CAP_SYS_ADMIN`), `ip`
//! from iproute2 and `nft` from nftables; it disappears with the last thread and process in it, so
//! nothing outlives a run.

use std::process::Command;

/// This thread's private network namespace.
pub struct Netns(());

/// A cut made by [`Netns::cut`]: the port it cuts.
#[derive(Debug)]
pub struct Cut {
    port: u16,
}

/// The namespace's table: a set of cut ports, and an `input` chain dropping their segments.
const TABLE: &str = "table inet locksim {
    set cut { type inet_service; }
    chain input {
        type filter hook input priority filter; policy accept;
        tcp sport @cut drop
        tcp dport @cut drop
    }
}";

impl Netns {
    /// Move the calling thread into a new network namespace with loopback up. Everything the thread
    /// opens or starts from now on is in it.
    pub fn enter() -> anyhow::Result<Netns> {
        // SAFETY: unshare with CLONE_NEWNET changes only this thread's network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            let e = std::io::Error::last_os_error();
            anyhow::bail!("cannot make a network namespace (unshare: {e}): client conformance needs root");
        }
        run("ip", &["link", "set", "lo", "up"])?;
        run("nft", &[TABLE])?;
        Ok(Netns(()))
    }

    /// Drop every TCP segment from or to `port` (a server's port cuts all its connections; a client's
    /// local port cuts that one connection), until [`Netns::heal`].
    pub fn cut(&self, port: u16) -> anyhow::Result<Cut> {
        run("nft", &[&format!("add element inet locksim cut {{ {port} }}")])?;
        Ok(Cut { port })
    }

    /// End a cut: what TCP held is delivered at its next retransmission.
    pub fn heal(&self, cut: Cut) -> anyhow::Result<()> {
        run("nft", &[&format!("delete element inet locksim cut {{ {} }}", cut.port)])
    }
}

/// Run `tool` (`ip`, `nft`) with `args`; its complaint is the error.
fn run(tool: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(tool).args(args).output().map_err(|e| {
        anyhow::anyhow!("cannot run `{tool}` (iproute2's ip, nftables' nft; run .ci/install-servers): {e}")
    })?;
    if !out.status.success() {
        anyhow::bail!("{tool} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
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
            // Written after the heal, behind the held byte: it goes with the retransmission, not at
            // once (it would if the cut had failed the first send inside the client's kernel).
            client.write_all(b"y").unwrap();
            server.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            assert_eq!(server.read(&mut byte).unwrap(), 1, "delivered after the heal");
            // Probed at 0.2 s, retransmitted at 0.4, 0.8 s …: the first after the heal at 0.5 s is at 0.8 s.
            assert!(sent.elapsed() >= Duration::from_millis(750), "by a retransmission: {:?}", sent.elapsed());
            assert_eq!(byte, *b"x");
        })
        .join()
        .unwrap();
        // The namespace was the thread's: this thread still reaches the machine's loopback as before.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    }
}
