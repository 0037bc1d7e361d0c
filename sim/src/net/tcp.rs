//! TCP's timers, as Linux runs them: when unacknowledged data and an unanswered SYN are sent again,
//! and when the kernel gives a connection up. The network ([`super`]) holds what a cut link carries
//! until these say it gets through.

/// Linux `TCP_RTO_MIN`: the first retransmission timeout on a connection with a millisecond RTT.
pub(super) const TCP_RTO_MIN_NS: u64 = 200_000_000;
/// Linux `TCP_RTO_MAX`: the retransmission timeout stops doubling here.
pub(super) const TCP_RTO_MAX_NS: u64 = 120_000_000_000;
/// Linux `net.ipv4.tcp_retries2` (default 15): retransmissions before the connection is given up.
pub(super) const TCP_RETRIES2: u32 = 15;
/// Linux `TCP_TIMEOUT_INIT`: the retransmission timeout of a SYN (RFC 6298's initial 1 s).
pub(super) const TCP_TIMEOUT_INIT_NS: u64 = 1_000_000_000;
/// Linux `net.ipv4.tcp_syn_retries` (default 6): SYN retransmissions before `connect` fails — at 1,
/// 3, 7, 15, 31 and 63 s, given up at 127 s (`tcp_write_timeout`, `net/ipv4/tcp_timer.c`).
pub(super) const TCP_SYN_RETRIES: u32 = 6;
/// Linux `tcp_orphan_retries()` (`net/ipv4/tcp_timer.c`): the retransmissions of a socket no process
/// holds any more (its process was killed). `net.ipv4.tcp_orphan_retries` defaults to 0, which means
/// 8 for a connection whose timeout has not reached `TCP_RTO_MAX` ("8 corresponds to >100 seconds
/// with minimal RTO of 200msec"): after the loss probe at 0.2 s, the 8th goes at 51.2 s and the kernel gives up at 102.4 s.
pub(super) const TCP_ORPHAN_RETRIES: u32 = 8;

/// When data first sent at `first_ns` and unacknowledged since gets through a link healed at
/// `heal_ns`: the first retransmission at or after the heal, or `None` if the kernel gave the
/// connection up before then. Real mode's proxies hold bytes across a partition by the same rule.
pub fn retransmission_after(first_ns: u64, heal_ns: u64) -> Option<u64> {
    retransmission_within(first_ns, heal_ns, TCP_RETRIES2)
}

/// [`retransmission_after`] for a connection that gives up after `retries` retransmissions by its
/// timer (the loss probe before them is not counted: `tcp_retransmit_timer` counts `icsk_retransmits`).
pub(super) fn retransmission_within(first_ns: u64, heal_ns: u64, retries: u32) -> Option<u64> {
    retransmissions(first_ns).take(retries as usize + 1).find(|at| *at >= heal_ns)
}

/// When a SYN first sent at `first_ns` gets through a link healed at `heal_ns`: the first SYN
/// retransmission at or after the heal (Linux `tcp_retransmit_timer` on a `SYN_SENT` socket, from
/// `TCP_TIMEOUT_INIT`, no loss probe: 1, 3, 7, 15 s …), or `None` once `connect` has failed
/// (`tcp_syn_retries`).
pub fn syn_retransmission_after(first_ns: u64, heal_ns: u64) -> Option<u64> {
    doubling(first_ns + TCP_TIMEOUT_INIT_NS, 2 * TCP_TIMEOUT_INIT_NS)
        .take(TCP_SYN_RETRIES as usize)
        .find(|at| *at >= heal_ns)
}

/// When Linux sends data first sent at `first_ns` again while it goes unacknowledged. First a tail
/// loss probe (`tcp_schedule_loss_probe`, `net/ipv4/tcp_output.c`: 2·srtt + `TCP_RTO_MIN` after a
/// lone segment in flight, a round trip being negligible beside it); `tcp_send_loss_probe` then arms
/// the retransmission timer for the RTO (`TCP_RTO_MIN` on a millisecond round trip), and
/// `tcp_retransmit_timer` doubles it after each retransmission up to `TCP_RTO_MAX`. So: 0.2, 0.4, 0.8,
/// 1.6, 3.2 s … after the first send. Checked on a real kernel by `locksim conform zk-client` and
/// `etcd-client` (a lone segment dropped at the receiver until a heal at 0.5 s arrives at 0.83 s; one
/// healed at 1.2 s, at 1.67 s).
pub(super) fn retransmissions(first_ns: u64) -> impl Iterator<Item = u64> {
    doubling(first_ns + TCP_RTO_MIN_NS, TCP_RTO_MIN_NS)
}

/// `at`, then `gap` later, the gap doubling each time up to `TCP_RTO_MAX`.
pub(super) fn doubling(at: u64, gap: u64) -> impl Iterator<Item = u64> {
    let mut gap = gap;
    std::iter::successors(Some(at), move |at| {
        let next = at + gap;
        gap = (gap * 2).min(TCP_RTO_MAX_NS);
        Some(next)
    })
}
