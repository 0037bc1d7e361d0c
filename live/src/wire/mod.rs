//! Blocking wire clients for the real servers: just what conformance and the launcher's readiness
//! checks say to them, one connection each, with timeouts.

pub mod http;
pub mod jute;
pub mod pgwire;
pub mod resp;

use std::time::Duration;

/// How long a real server may take to answer before the request counts as unanswered: far beyond any
/// wait a script asks for, so that a server that never answers ends the step instead of the run.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
