//! The JSON-lines protocol between locksim and a client process (see the module doc of [`super`]).
//!
//! locksim writes one [`Request`] per line to the process's stdin and reads one [`Message`] per line
//! from its stdout. A line that is not one of the messages below is an error naming the client and
//! the line: a broken adapter is a harness error (exit 2), never a finding.

use serde_json::Value;

/// What locksim asks of a client process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Take the lock (answered by `Ok`, `Fail` or `Unknown`).
    Acquire,
    /// Take it shared, as a reader (answered as `Acquire`); sent only when the scenario has `reads`.
    AcquireShared,
    /// Give it up (answered by `Ok`, `Fail` or `Unknown`).
    Release,
    /// About to read the resource in the critical section (answered `{"entered":true}`).
    Enter,
    /// About to write the resource, ending the critical section (answered `{"writing":true}`).
    Write,
}

impl Request {
    /// The answer of a client without a lock (a baseline's): every call succeeds at once.
    pub fn unguarded(self) -> Message {
        match self {
            Request::Acquire | Request::AcquireShared | Request::Release => Message::Ok { token: None },
            Request::Enter => Message::Entered,
            Request::Write => Message::Writing,
        }
    }

    /// How errors name it.
    pub fn name(self) -> &'static str {
        match self {
            Request::Acquire => "acquire",
            Request::AcquireShared => "acquire (shared)",
            Request::Release => "release",
            Request::Enter => "enter",
            Request::Write => "write",
        }
    }

    /// An acknowledgement the process owes at once (`enter`, `write`), not a call on the lock service,
    /// which may rightly wait.
    pub fn is_acknowledgement(self) -> bool {
        matches!(self, Request::Enter | Request::Write)
    }

    /// The line to send, newline included.
    pub fn line(self) -> &'static str {
        match self {
            Request::Acquire => "{\"op\":\"acquire\"}\n",
            Request::AcquireShared => "{\"op\":\"acquire\",\"shared\":true}\n",
            Request::Release => "{\"op\":\"release\"}\n",
            Request::Enter => "{\"op\":\"enter\"}\n",
            Request::Write => "{\"op\":\"write\"}\n",
        }
    }
}

/// What a client process says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `{"ok":true,"token":N|null}`: the call succeeded (a token only for `acquire`, if any).
    Ok { token: Option<u64> },
    /// `{"ok":false,"reason":"..."}`: the call definitely failed.
    Fail { reason: String },
    /// `{"unknown":"..."}`: the call ended without knowing whether it took effect (a timeout).
    Unknown { reason: String },
    /// `{"entered":true}`: the answer to `enter`.
    Entered,
    /// `{"writing":true}`: the answer to `write`.
    Writing,
    /// `{"lost":"..."}`, unprompted: the library says the lock it held is gone.
    Lost { reason: String },
}

impl Message {
    /// The message in words, for errors: `{"entered":true}`, never `Entered`.
    pub fn words(&self) -> String {
        match self {
            Message::Ok { token: None } => "{\"ok\":true}".to_string(),
            Message::Ok { token: Some(t) } => format!("{{\"ok\":true,\"token\":{t}}}"),
            Message::Fail { reason } => format!("{{\"ok\":false}} (a failure: {reason:?})"),
            Message::Unknown { reason } => format!("{{\"unknown\":...}} (an unknown outcome: {reason:?})"),
            Message::Entered => "{\"entered\":true} (the answer to enter)".to_string(),
            Message::Writing => "{\"writing\":true} (the answer to write)".to_string(),
            Message::Lost { reason } => format!("{{\"lost\":...}} (the lock is gone: {reason:?})"),
        }
    }
}

/// The error for `client` answering `m` to `to` (a request's name), in words: what it said, and what
/// `to` expects.
pub fn unexpected(client: &str, m: &Message, to: &str) -> String {
    let expected = match to {
        "acquire" | "acquire (shared)" | "release" => "; expected {\"ok\":...} or {\"unknown\":...}",
        "enter" => "; expected {\"entered\":true}",
        "write" => "; expected {\"writing\":true}",
        _ => "",
    };
    format!("{client}: the command answered {} to {to}{expected}", m.words())
}

/// A line that is not a message, in words naming the client and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    pub client: String,
    pub line: String,
    pub why: String,
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: bad line from the command: {:?}: {}", self.client, self.line, self.why)
    }
}

impl std::error::Error for ProtocolError {}

/// Parse one line from `client`'s stdout.
pub fn parse(client: &str, line: &str) -> Result<Message, ProtocolError> {
    let err = |why: &str| ProtocolError { client: client.to_string(), line: shorten(line), why: why.to_string() };
    let value: Value = serde_json::from_str(line.trim()).map_err(|e| err(&format!("not JSON ({e})")))?;
    let obj = value.as_object().ok_or_else(|| err("expected a JSON object"))?;
    let text = |key: &str| obj.get(key).and_then(Value::as_str).map(str::to_string);
    if let Some(ok) = obj.get("ok") {
        return match ok.as_bool() {
            Some(true) => match obj.get("token") {
                None | Some(Value::Null) => Ok(Message::Ok { token: None }),
                Some(t) => t
                    .as_u64()
                    .map(|t| Message::Ok { token: Some(t) })
                    .ok_or_else(|| err("\"token\" must be a whole number from 0 or null")),
            },
            Some(false) => text("reason")
                .map(|reason| Message::Fail { reason })
                .ok_or_else(|| err("{\"ok\":false} needs a \"reason\" string")),
            None => Err(err("\"ok\" must be true or false")),
        };
    }
    if obj.contains_key("unknown") {
        return text("unknown")
            .map(|reason| Message::Unknown { reason })
            .ok_or_else(|| err("\"unknown\" must be a string"));
    }
    if obj.contains_key("lost") {
        return text("lost").map(|reason| Message::Lost { reason }).ok_or_else(|| err("\"lost\" must be a string"));
    }
    if obj.get("entered") == Some(&Value::Bool(true)) {
        return Ok(Message::Entered);
    }
    if obj.get("writing") == Some(&Value::Bool(true)) {
        return Ok(Message::Writing);
    }
    Err(err("expected {\"ok\":...}, {\"unknown\":...}, {\"lost\":...}, {\"entered\":true} or {\"writing\":true}"))
}

/// A line as an error quotes it: at most 200 characters.
fn shorten(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_parses() {
        let p = |l: &str| parse("client-0", l).unwrap();
        assert_eq!(p(r#"{"ok":true,"token":7}"#), Message::Ok { token: Some(7) });
        assert_eq!(p(r#"{"ok":true,"token":null}"#), Message::Ok { token: None });
        assert_eq!(p(r#"{"ok":true}"#), Message::Ok { token: None });
        assert_eq!(p(r#"{"ok":false,"reason":"timed out"}"#), Message::Fail { reason: "timed out".into() });
        assert_eq!(p(r#"{"unknown":"socket timeout"}"#), Message::Unknown { reason: "socket timeout".into() });
        assert_eq!(p(r#"{"lost":"expired"}"#), Message::Lost { reason: "expired".into() });
        assert_eq!(p("{\"entered\":true}\n"), Message::Entered);
        assert_eq!(p(r#" {"writing":true} "#), Message::Writing);
    }

    #[test]
    fn every_request_is_one_json_line() {
        for (request, json) in [
            (Request::Acquire, serde_json::json!({"op": "acquire"})),
            (Request::AcquireShared, serde_json::json!({"op": "acquire", "shared": true})),
            (Request::Release, serde_json::json!({"op": "release"})),
            (Request::Enter, serde_json::json!({"op": "enter"})),
            (Request::Write, serde_json::json!({"op": "write"})),
        ] {
            let line = request.line();
            assert_eq!(line.matches('\n').count(), 1, "{line}");
            assert!(line.ends_with('\n'), "{line}");
            assert_eq!(serde_json::from_str::<Value>(line).unwrap(), json);
        }
    }

    #[test]
    fn an_answer_to_the_wrong_request_reads_as_words() {
        let text = unexpected("client-1", &Message::Entered, "acquire");
        assert_eq!(
            text,
            "client-1: the command answered {\"entered\":true} (the answer to enter) to acquire; \
             expected {\"ok\":...} or {\"unknown\":...}"
        );
        let text = unexpected("client-0", &Message::Ok { token: Some(7) }, "write");
        assert_eq!(
            text,
            "client-0: the command answered {\"ok\":true,\"token\":7} to write; expected {\"writing\":true}"
        );
        let text = unexpected("client-0", &Message::Fail { reason: "busy".into() }, "enter");
        assert!(text.contains("answered {\"ok\":false} (a failure: \"busy\") to enter"), "{text}");
    }

    #[test]
    fn a_bad_line_names_the_client_and_the_line() {
        let e = parse("client-2", "Traceback (most recent call last):").unwrap_err();
        assert_eq!(e.client, "client-2");
        let text = e.to_string();
        assert!(
            text.starts_with("client-2: bad line from the command: \"Traceback (most recent call last):\": not JSON"),
            "{text}"
        );
        for (line, why) in [
            ("[1,2]", "expected a JSON object"),
            (r#"{"ok":"yes"}"#, "\"ok\" must be true or false"),
            (r#"{"ok":false}"#, "needs a \"reason\""),
            (r#"{"ok":true,"token":-1}"#, "\"token\" must be"),
            (r#"{"ok":true,"token":"7"}"#, "\"token\" must be"),
            (r#"{"lost":3}"#, "\"lost\" must be a string"),
            (r#"{"entered":false}"#, "expected {\"ok\""),
            ("", "not JSON"),
        ] {
            let e = parse("client-1", line).unwrap_err().to_string();
            assert!(e.starts_with("client-1: bad line from the command: "), "{e}");
            assert!(e.contains(why), "{line}: {e}");
        }
    }

    #[test]
    fn a_long_bad_line_is_quoted_shortened() {
        let e = parse("client-0", &"x".repeat(5000)).unwrap_err();
        assert!(e.line.chars().count() <= 201);
    }
}
