//! A minimal RESP2 client for the real Redis: commands as arrays of bulk strings, replies parsed as
//! the server sent them. Conformance wants the raw reply (an error's exact text, nil against an empty
//! string), which a full client library would interpret, so this is written out rather than taken
//! from a crate.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

/// A reply as the server sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<Value>>),
}

pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    pub fn on(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(super::ANSWER_TIMEOUT));
        let writer = stream.try_clone().expect("a TCP stream clones");
        Conn { reader: BufReader::new(stream), writer }
    }

    pub fn command(&mut self, args: &[&str]) -> std::io::Result<Value> {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.writer.write_all(out.as_bytes())?;
        self.read()
    }

    /// What the server pushed unasked (pub/sub messages): values until none comes within `wait`.
    pub fn pushes(&mut self, wait: std::time::Duration) -> std::io::Result<Vec<Value>> {
        self.reader.get_ref().set_read_timeout(Some(wait))?;
        let mut values = Vec::new();
        let end = loop {
            match self.read() {
                Ok(v) => values.push(v),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    break Ok(values)
                }
                Err(e) => break Err(e),
            }
        };
        self.reader.get_ref().set_read_timeout(Some(super::ANSWER_TIMEOUT))?;
        end
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection"));
        }
        Ok(line.trim_end_matches("\r\n").to_string())
    }

    fn read(&mut self) -> std::io::Result<Value> {
        let line = self.line()?;
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not RESP: {line:?}"));
        let (tag, rest) = line.split_at_checked(1).ok_or_else(bad)?;
        let number = || rest.parse::<i64>().map_err(|_| bad());
        Ok(match tag {
            "+" => Value::Simple(rest.to_string()),
            "-" => Value::Error(rest.to_string()),
            ":" => Value::Int(number()?),
            "$" if number()? < 0 => Value::Bulk(None),
            "$" => {
                let mut data = vec![0; number()? as usize + 2];
                std::io::Read::read_exact(&mut self.reader, &mut data)?;
                data.truncate(data.len() - 2);
                Value::Bulk(Some(String::from_utf8_lossy(&data).into_owned()))
            }
            "*" if number()? < 0 => Value::Array(None),
            "*" => Value::Array(Some((0..number()?).map(|_| self.read()).collect::<Result<_, _>>()?)),
            _ => return Err(bad()),
        })
    }
}
