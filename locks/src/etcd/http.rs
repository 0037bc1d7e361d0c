//! Just enough HTTP/1.1 for etcd's JSON gateway, without I/O: a POST of a JSON body on a connection of
//! its own (`Connection: close`), and its answer decoded from whatever bytes arrive — the status, then
//! the body whole or, for a watch, line by line as the server streams it (chunked, by `Content-Length`,
//! or until the connection closes). Real mode's client ([`super::real`], on tokio) and conformance's
//! blocking client (in the live crate) are transports over it: they move bytes, keep time and decide
//! what an error means.

use std::io;

/// The bytes of a POST of the JSON `body` to `path` on `host` (`host:port`).
pub fn post(host: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An answer being read: [`Response::feed`] it what the connection gives, [`Response::end`] when the
/// connection closes; meanwhile it says its status and hands out the body.
#[derive(Default)]
pub struct Response {
    /// The status line once read (`HTTP/1.1 200 OK`), and its code.
    status: Option<(String, u16)>,
    /// How the rest of the body comes.
    state: State,
    /// Bytes read and not yet decoded.
    raw: Vec<u8>,
    /// Body bytes decoded and not yet handed out.
    body: Vec<u8>,
}

#[derive(Default, Clone, Copy, PartialEq, Debug)]
enum State {
    /// The status line comes next.
    #[default]
    Head,
    /// A header, or the empty line that ends them (chunked: `Transfer-Encoding: chunked` seen; length:
    /// `Content-Length`).
    Headers {
        chunked: bool,
        length: Option<usize>,
    },
    /// This many body bytes are left.
    Length(usize),
    /// A chunk's size line comes next.
    ChunkSize,
    /// This many bytes of a chunk are left, then its CRLF.
    Chunk(usize),
    ChunkEnd,
    /// The body runs until the connection closes.
    UntilClose,
    Done,
}

impl Response {
    /// Take in bytes the connection gave; an error if they are not an HTTP answer.
    pub fn feed(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.raw.extend_from_slice(bytes);
        while self.step()? {}
        Ok(())
    }

    /// The connection closed: fine after the whole answer (or for a body that runs until the close),
    /// an error if the answer was cut short.
    pub fn end(&mut self) -> io::Result<()> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                Ok(())
            }
            State::Head | State::Headers { .. } => Err(bad("the headers end early")),
            _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the answer's body ends early")),
        }
    }

    /// The status code, once the status line and headers are in.
    pub fn status(&self) -> Option<u16> {
        self.status.as_ref().filter(|_| !matches!(self.state, State::Head | State::Headers { .. })).map(|s| s.1)
    }

    /// The status line as the server wrote it (`HTTP/1.1 404 Not Found`), once read.
    pub fn status_line(&self) -> &str {
        self.status.as_ref().map_or("", |s| s.0.as_str())
    }

    /// Whether the whole answer is in.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The body's next complete line, trimmed; once the answer is done, what is left of it (if anything).
    pub fn next_line(&mut self) -> Option<String> {
        if let Some(end) = self.body.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.body.drain(..=end).collect();
            return Some(String::from_utf8_lossy(&line).trim().to_string());
        }
        let rest = String::from_utf8_lossy(&self.body).trim().to_string();
        (self.is_done() && !rest.is_empty()).then(|| {
            self.body.clear();
            rest
        })
    }

    /// The body decoded so far, not yet handed out.
    pub fn take_body(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.body)).into_owned()
    }

    /// Decode what `raw` holds for the current state; false when it needs more bytes.
    fn step(&mut self) -> io::Result<bool> {
        match self.state {
            State::Head | State::Headers { .. } | State::ChunkSize => {
                let Some(line) = self.line() else { return Ok(false) };
                self.header_or_size(&line)?;
            }
            State::Length(left) | State::Chunk(left) => {
                let n = left.min(self.raw.len());
                if n == 0 {
                    return Ok(false);
                }
                self.body.extend(self.raw.drain(..n));
                self.state = match (self.state, left - n) {
                    (State::Length(_), 0) => State::Done,
                    (State::Length(_), left) => State::Length(left),
                    (_, 0) => State::ChunkEnd,
                    (_, left) => State::Chunk(left),
                };
            }
            State::ChunkEnd => {
                if self.raw.len() < 2 {
                    return Ok(false);
                }
                self.raw.drain(..2);
                self.state = State::ChunkSize;
            }
            State::UntilClose => {
                if self.raw.is_empty() {
                    return Ok(false);
                }
                self.body.append(&mut self.raw);
            }
            State::Done => return Ok(false),
        }
        Ok(true)
    }

    /// A line of the head, or a chunk's size.
    fn header_or_size(&mut self, line: &str) -> io::Result<()> {
        self.state = match self.state {
            State::Head => {
                let code = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(line))?;
                self.status = Some((line.to_string(), code));
                State::Headers { chunked: false, length: None }
            }
            State::Headers { chunked, length } if line.is_empty() => match (chunked, length) {
                (true, _) => State::ChunkSize,
                (false, Some(0)) => State::Done,
                (false, Some(n)) => State::Length(n),
                (false, None) => State::UntilClose,
            },
            State::Headers { chunked, length } => {
                let header = line.to_ascii_lowercase();
                let value = |name: &str| header.strip_prefix(name).map(str::trim);
                let chunked = chunked || value("transfer-encoding:").is_some_and(|v| v.contains("chunked"));
                let length = match value("content-length:") {
                    Some(n) => Some(n.parse().map_err(|_| bad(line))?),
                    None => length,
                };
                State::Headers { chunked, length }
            }
            _ => match usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16) {
                Ok(0) => State::Done,
                Ok(n) => State::Chunk(n),
                Err(_) => return Err(bad(&format!("bad chunk size {line:?}"))),
            },
        };
        Ok(())
    }

    /// The next line of `raw` without its line end, if a whole one is in.
    fn line(&mut self) -> Option<String> {
        let end = self.raw.iter().position(|b| *b == b'\n')?;
        let line: Vec<u8> = self.raw.drain(..=end).collect();
        Some(String::from_utf8_lossy(&line).trim_end().to_string())
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("not the gateway's HTTP: {}", what.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `answer` fed a byte at a time, then the close.
    fn read(answer: &str) -> (Response, Vec<String>, io::Result<()>) {
        let mut response = Response::default();
        let mut lines = Vec::new();
        for b in answer.as_bytes() {
            response.feed(std::slice::from_ref(b)).unwrap();
            lines.extend(response.next_line());
        }
        let end = response.end();
        lines.extend(std::iter::from_fn(|| response.next_line()));
        (response, lines, end)
    }

    #[test]
    fn a_chunked_stream_gives_its_lines_as_they_come() {
        let answer = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n{\"a\":1\r\n2;x=y\r\n}\n\r\n4\r\n{\"b\"\r\n0\r\n\r\n";
        let (response, lines, end) = read(answer);
        assert_eq!((response.status(), response.is_done()), (Some(200), true));
        assert_eq!(lines, ["{\"a\":1}", "{\"b\""]);
        end.unwrap();
    }

    #[test]
    fn a_body_by_length_or_until_the_close_is_whole() {
        let mut response = Response::default();
        response.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"k\":1}").unwrap();
        assert!(response.is_done());
        assert_eq!(response.take_body(), "{\"k\":1}");
        let (response, lines, end) = read("HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\nnot\nhere");
        end.unwrap();
        assert_eq!((response.status_line(), lines), ("HTTP/1.1 404 Not Found", vec!["not".to_string(), "here".into()]));
    }

    #[test]
    fn an_answer_cut_short_is_an_error() {
        let (_, _, end) = read("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{\"k\"");
        assert_eq!(end.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let (response, _, end) = read("HTTP/1.1 200 OK\r\nContent-Le");
        assert_eq!((response.status(), end.unwrap_err().kind()), (None, io::ErrorKind::InvalidData));
        let mut garbage = Response::default();
        assert!(garbage.feed(b"SSH-2.0-OpenSSH\r\n").is_err());
    }
}
