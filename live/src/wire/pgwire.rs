//! A minimal PostgreSQL client for the real server: protocol 3.0, trust authentication, the simple
//! query protocol. Conformance wants what the server sent — the command tag (`COMMIT` answered
//! `ROLLBACK`), the SQLSTATE of an error, a FATAL message before the connection closes — which a client
//! library would turn into exceptions, so this is written out (about as long as the RESP client)
//! rather than taken from a crate with its own runtime.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// What one query got back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The last `CommandComplete` tag (`SELECT 1`, `UPDATE 0`, `COMMIT`, `ROLLBACK`, …).
    pub tag: String,
    /// Every data row, each value as text (`None`: SQL NULL).
    pub rows: Vec<Vec<Option<String>>>,
    /// An `ErrorResponse`: SQLSTATE and message.
    pub error: Option<(String, String)>,
    /// The server closed the connection after answering (a FATAL error, or no answer at all).
    pub closed: bool,
}

/// The `application_name` of locksim's sessions.
pub const APPLICATION: &str = "locksim-conform";

pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    /// Open a session as `postgres` on database `postgres` (the server trusts loopback), named
    /// [`APPLICATION`] so that locksim can tell its own sessions from others on a server it did not start.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(super::ANSWER_TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut conn = Conn { reader: BufReader::new(stream), writer };
        let mut body = 196_608u32.to_be_bytes().to_vec(); // protocol 3.0
        for part in ["user", "postgres", "database", "postgres", "application_name", APPLICATION, ""] {
            body.extend_from_slice(part.as_bytes());
            body.push(0);
        }
        let mut startup = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        startup.extend(body);
        conn.writer.write_all(&startup)?;
        let reply = conn.until_ready()?;
        if let Some((code, message)) = reply.error {
            anyhow::bail!("the server refused the session: {code} {message}");
        }
        if reply.closed {
            anyhow::bail!("the server closed the connection while it started the session");
        }
        Ok(conn)
    }

    /// Send one query (possibly several statements) and read until the server is ready again.
    pub fn query(&mut self, sql: &str) -> std::io::Result<Reply> {
        let mut message = vec![b'Q'];
        message.extend_from_slice(&((sql.len() + 5) as u32).to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        if let Err(e) = self.writer.write_all(&message) {
            // The server may have said why it closed the connection before it did.
            return self.until_ready().or(Err(e));
        }
        self.until_ready()
    }

    /// The local port of the connection (a cut of it drops this port's segments).
    pub fn local_port(&self) -> std::io::Result<u16> {
        Ok(self.writer.local_addr()?.port())
    }

    /// How long a statement may wait for its result (connect sets [`super::ANSWER_TIMEOUT`]).
    pub fn set_read_timeout(&self, timeout: Duration) -> std::io::Result<()> {
        self.reader.get_ref().set_read_timeout(Some(timeout))
    }

    /// Close the socket with no word to the server, as the kernel does for a killed process: a FIN,
    /// and nothing more will be sent or read.
    pub fn close_socket(&self) {
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
    }

    /// Close the session as a client library does (`Terminate`, then the socket).
    pub fn terminate(mut self) {
        let _ = self.writer.write_all(&[b'X', 0, 0, 0, 4]);
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
    }

    fn until_ready(&mut self) -> std::io::Result<Reply> {
        let mut reply = Reply::default();
        loop {
            let Some((kind, body)) = self.message()? else {
                reply.closed = true;
                return Ok(reply);
            };
            match kind {
                b'Z' => return Ok(reply),
                b'C' => reply.tag = cstr(&body, &mut 0),
                b'D' => reply.rows.push(data_row(&body)),
                b'E' => reply.error = Some(error_fields(&body)),
                b'R' if body.get(..4) != Some(&[0, 0, 0, 0]) => {
                    return Err(std::io::Error::other(
                        "the server asks for a password (locksim's servers trust loopback)",
                    ))
                }
                // Authentication OK, parameters, the key for cancelling, row descriptions, notices
                // (a WARNING of `pg_advisory_unlock`), an empty query.
                _ => {}
            }
        }
    }

    /// The next message, or `None` when the server closed the connection (after an error it sent,
    /// or before it answered at all).
    fn message(&mut self) -> std::io::Result<Option<(u8, Vec<u8>)>> {
        let mut head = [0u8; 5];
        match self.reader.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if closed(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        self.reader.read_exact(&mut body)?;
        Ok(Some((head[0], body)))
    }
}

fn closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe)
}

fn cstr(body: &[u8], at: &mut usize) -> String {
    let end = body[*at..].iter().position(|b| *b == 0).map_or(body.len(), |p| *at + p);
    let s = String::from_utf8_lossy(&body[*at..end]).into_owned();
    *at = end + 1;
    s
}

fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let n = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    (0..n)
        .map(|_| {
            let len = i32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
            at += 4;
            (len >= 0).then(|| {
                let v = String::from_utf8_lossy(&body[at..at + len as usize]).into_owned();
                at += len as usize;
                v
            })
        })
        .collect()
}

/// An `ErrorResponse`'s SQLSTATE (`C`) and message (`M`).
fn error_fields(body: &[u8]) -> (String, String) {
    let (mut code, mut message, mut at) = (String::new(), String::new(), 0);
    while at < body.len() && body[at] != 0 {
        let field = body[at];
        at += 1;
        let value = cstr(body, &mut at);
        match field {
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
    }
    (code, message)
}
