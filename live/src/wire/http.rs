//! etcd's JSON gateway over blocking sockets: a POST answered in full, and a POST whose answer is a
//! stream of JSON lines (a watch) that another thread can close by shutting its socket down — which a
//! client library that owns its sockets does not allow. The HTTP itself is real mode's
//! ([`locksim_locks::etcd::http`]); this only moves its bytes.

use locksim_locks::etcd::http::{self, Response};
use std::fmt;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

/// Why a POST got no answer to read.
#[derive(Debug)]
pub enum Error {
    /// The connection failed, timed out or carried no HTTP answer.
    Io(std::io::Error),
    /// The server answered with another status than 200: its status line, and the body (the gateway's
    /// JSON error, such as `etcdserver: requested lease not found`).
    Status { line: String, body: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::Status { line, body } => write!(f, "{line}: {body}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

fn request(addr: SocketAddr, path: &str, body: &str) -> Result<Lines, Error> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(super::ANSWER_TIMEOUT))?;
    stream.write_all(&http::post(&addr.to_string(), path, body))?;
    let mut lines = Lines { stream, answer: Response::default() };
    while lines.answer.status().is_none() {
        lines.fill()?;
    }
    if lines.answer.status() != Some(200) {
        let line = lines.answer.status_line().trim().to_string();
        return Err(Error::Status { line, body: lines.rest()? });
    }
    Ok(lines)
}

/// POST `body` to `path` and return the whole answer.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> Result<String, Error> {
    Ok(request(addr, path, body)?.rest()?)
}

/// POST `body` to `path`: the socket (to shut down) and the answer's lines as they come.
pub fn open(addr: SocketAddr, path: &str, body: &str) -> Result<(Closer, Lines), Error> {
    let lines = request(addr, path, body)?;
    // A stream may rightly stay quiet for as long as nothing changes.
    lines.stream.set_read_timeout(None)?;
    Ok((Closer(lines.stream.try_clone()?), lines))
}

/// Closes a streamed answer from any thread: its reader sees the end.
pub struct Closer(TcpStream);

impl Drop for Closer {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

/// An answer's body as lines.
pub struct Lines {
    stream: TcpStream,
    answer: Response,
}

impl Lines {
    /// The next line; `None` at the end of the answer, an error if it broke off (its socket was shut
    /// down, the server died).
    pub fn next_line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(line) = self.answer.next_line() {
                return Ok(Some(line));
            }
            if self.answer.is_done() {
                return Ok(None);
            }
            self.fill()?;
        }
    }

    /// The rest of the body, its lines joined without their line ends.
    fn rest(&mut self) -> std::io::Result<String> {
        let mut all = String::new();
        while let Some(line) = self.next_line()? {
            all.push_str(&line);
        }
        Ok(all)
    }

    /// Read what the socket has into the answer.
    fn fill(&mut self) -> std::io::Result<()> {
        let mut buf = [0; 4096];
        match self.stream.read(&mut buf)? {
            0 => self.answer.end(),
            n => self.answer.feed(&buf[..n]),
        }
    }
}
