//! Just enough HTTP/1.1 for etcd's JSON gateway: a POST answered in full, and a POST whose answer is a
//! stream of JSON lines (a watch) that another thread can close by shutting its socket down — which a
//! client library that owns its sockets does not allow.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

/// How the answer's body is framed: chunked, or this many bytes.
enum Framing {
    Chunked,
    Length(usize),
}

fn request(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<(TcpStream, BufReader<TcpStream>, Framing)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(super::ANSWER_TIMEOUT))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut status = String::new();
    reader.read_line(&mut status)?;
    let (mut chunked, mut length) = (false, None);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
        let lower = header.to_ascii_lowercase();
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        if let Some(n) = lower.strip_prefix("content-length:") {
            length = n.trim().parse::<usize>().ok();
        }
    }
    let framing = if chunked { Framing::Chunked } else { Framing::Length(length.unwrap_or(0)) };
    if !status.contains(" 200 ") {
        let mut lines = Lines { reader, framing, buffer: Vec::new(), done: false };
        let mut body = String::new();
        while let Some(line) = lines.next_line()? {
            body.push_str(&line);
        }
        return Err(std::io::Error::other(format!("{}: {body}", status.trim())));
    }
    Ok((stream, reader, framing))
}

/// POST `body` to `path` and return the whole answer.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<String> {
    let (_stream, reader, framing) = request(addr, path, body)?;
    let mut lines = Lines { reader, framing, buffer: Vec::new(), done: false };
    let mut all = String::new();
    while let Some(line) = lines.next_line()? {
        all.push_str(&line);
    }
    Ok(all)
}

/// POST `body` to `path`: the socket (to shut down) and the answer's lines as they come.
pub fn open(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<(Closer, Lines)> {
    let (stream, reader, framing) = request(addr, path, body)?;
    // A stream may rightly stay quiet for as long as nothing changes.
    stream.set_read_timeout(None)?;
    Ok((Closer(stream), Lines { reader, framing, buffer: Vec::new(), done: false }))
}

/// Closes a streamed answer from any thread: its reader sees the end.
pub struct Closer(TcpStream);

impl Drop for Closer {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

/// An answer's body as lines, through chunked encoding if the server used it.
pub struct Lines {
    reader: BufReader<TcpStream>,
    framing: Framing,
    buffer: Vec<u8>,
    done: bool,
}

impl Lines {
    /// The next line; `None` at the end of the answer (or when its socket was shut down).
    pub fn next_line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Ok(Some(String::from_utf8_lossy(&line).trim().to_string()));
            }
            if self.done {
                let rest = std::mem::take(&mut self.buffer);
                let rest = String::from_utf8_lossy(&rest).trim().to_string();
                return Ok((!rest.is_empty()).then_some(rest));
            }
            if !self.fill()? {
                self.done = true;
            }
        }
    }

    /// Read more of the body; false at its end.
    fn fill(&mut self) -> std::io::Result<bool> {
        if let Framing::Length(left) = &mut self.framing {
            if *left == 0 {
                return Ok(false);
            }
            let mut data = vec![0; *left];
            self.reader.read_exact(&mut data)?;
            *left = 0;
            self.buffer.extend(data);
            return Ok(true);
        }
        let mut size = String::new();
        if self.reader.read_line(&mut size).unwrap_or(0) == 0 {
            return Ok(false);
        }
        let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {size:?}")))?;
        if size == 0 {
            return Ok(false);
        }
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk)?;
        self.buffer.extend_from_slice(&chunk[..size]);
        Ok(true)
    }
}
