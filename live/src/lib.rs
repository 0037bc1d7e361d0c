//! locksim's real processes: everything that starts, signals or talks to a real server or client process.
//!
//! Module map:
//! - [`servers`]: the real servers (Redis, etcd, ZooKeeper, PostgreSQL) started on loopback in a
//!   temporary directory, reset between runs, killed and stopped on command.
//! - [`process`]: signals (kill(2)) to those processes and what they forked, and children that die
//!   with locksim.
//! - [`wire`]: the small blocking clients conformance speaks to them with (RESP, jute, pgwire, HTTP).
//! - [`conform`]: the simulated servers and clients against the real ones (`locksim conform`).
//! - [`real`]: real mode (`locksim run FILE --real`): recipes and users' libraries in client processes
//!   against real servers.

pub mod conform;
pub mod process;
pub mod real;
pub mod servers;
pub mod wire;
