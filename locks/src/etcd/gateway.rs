//! etcd's JSON gateway (`/v3/...`: the gRPC API as JSON over HTTP/1.1, served on the client port by
//! etcd 3.4 and 3.5): the requests the recipes send and the answers they read, as JSON. Real mode's
//! client ([`super::real`]) and the conformance run against the real server both speak it, over the
//! HTTP of [`super::http`].
//!
//! The gateway's JSON is protobuf's: bytes (keys, values) are base64, 64-bit integers are strings, and a
//! field holding its zero value (a revision 0, `succeeded: false`, the event type `PUT`) is left out.

use base64::Engine;
use locksim_sim::backend::etcd::{
    Cmp, Compare, EtcdError, EtcdReply, EtcdRequest, Event, EventType, KeyValue, Op, OpResult, Range, SortOrder,
    SortTarget, Target,
};
use serde_json::{json, Value};

/// A key or value as the gateway carries bytes.
pub fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(v: &Value) -> String {
    let bytes = base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or("")).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A JSON integer as the gateway writes it (int64 as a string; absent when zero).
pub fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of a prefix range: the prefix with its last byte plus one (clientv3's `GetPrefixRangeEnd`).
fn range_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    *bytes.last_mut().expect("a prefix") += 1;
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A `key` and, for a prefix, its `range_end`.
fn key_range(key: &str, prefix: bool) -> Value {
    let mut body = json!({ "key": b64(key) });
    if prefix {
        body["range_end"] = json!(b64(&range_end(key)));
    }
    body
}

/// A `RangeRequest`.
pub fn range(r: &Range) -> Value {
    let mut body = key_range(&r.key, r.prefix);
    if let Some((target, order)) = r.sort {
        body["sort_target"] = json!(match target {
            SortTarget::Key => "KEY",
            SortTarget::Create => "CREATE",
            SortTarget::Mod => "MOD",
        });
        body["sort_order"] = json!(match order {
            SortOrder::Ascend => "ASCEND",
            SortOrder::Descend => "DESCEND",
        });
    }
    if r.limit > 0 {
        body["limit"] = json!(r.limit.to_string());
    }
    if r.max_create_revision > 0 {
        body["max_create_revision"] = json!(r.max_create_revision.to_string());
    }
    body
}

/// A `PutRequest` (`lease` 0: none).
pub fn put(key: &str, value: &str, lease: i64) -> Value {
    let mut body = json!({ "key": b64(key), "value": b64(value) });
    if lease != 0 {
        body["lease"] = json!(lease.to_string());
    }
    body
}

/// A transaction's `Compare`.
pub fn compare(c: &Compare) -> Value {
    let (target, field, constant) = match &c.target {
        Target::Value(v) => ("VALUE", "value", json!(b64(v))),
        Target::Version(n) => ("VERSION", "version", json!(n.to_string())),
        Target::CreateRevision(r) => ("CREATE", "create_revision", json!(r.to_string())),
        Target::ModRevision(r) => ("MOD", "mod_revision", json!(r.to_string())),
    };
    let result = match c.cmp {
        Cmp::Equal => "EQUAL",
        Cmp::NotEqual => "NOT_EQUAL",
        Cmp::Less => "LESS",
        Cmp::Greater => "GREATER",
    };
    let mut body = json!({ "key": b64(&c.key), "result": result, "target": target });
    body[field] = constant;
    body
}

/// One request inside a transaction (`RequestOp`).
fn request_op(op: &Op) -> Value {
    match op {
        Op::Range(r) => json!({ "request_range": range(r) }),
        Op::Put { key, value, lease } => json!({ "request_put": put(key, value, *lease) }),
        Op::Delete { key, prefix } => json!({ "request_delete_range": key_range(key, *prefix) }),
    }
}

/// The gateway's path and JSON body for `request`; `None` for the watch requests, which ride a stream
/// of their own ([`watch_create`]).
pub fn encode(request: &EtcdRequest) -> Option<(&'static str, Value)> {
    Some(match request {
        EtcdRequest::Op(Op::Range(r)) => ("/v3/kv/range", range(r)),
        EtcdRequest::Op(Op::Put { key, value, lease }) => ("/v3/kv/put", put(key, value, *lease)),
        EtcdRequest::Op(Op::Delete { key, prefix }) => ("/v3/kv/deleterange", key_range(key, *prefix)),
        EtcdRequest::Txn { compare: cs, success, failure } => (
            "/v3/kv/txn",
            json!({
                "compare": cs.iter().map(compare).collect::<Vec<_>>(),
                "success": success.iter().map(request_op).collect::<Vec<_>>(),
                "failure": failure.iter().map(request_op).collect::<Vec<_>>(),
            }),
        ),
        EtcdRequest::LeaseGrant { ttl_s } => ("/v3/lease/grant", json!({ "TTL": ttl_s.to_string() })),
        EtcdRequest::LeaseKeepAlive { id } => ("/v3/lease/keepalive", json!({ "ID": id.to_string() })),
        EtcdRequest::LeaseRevoke { id } => ("/v3/lease/revoke", json!({ "ID": id.to_string() })),
        EtcdRequest::LeaseTimeToLive { id } => ("/v3/lease/timetolive", json!({ "ID": id.to_string() })),
        EtcdRequest::Watch { .. } | EtcdRequest::CancelWatch { .. } => return None,
    })
}

/// A `KeyValue`.
pub fn kv(v: &Value) -> KeyValue {
    KeyValue {
        key: unb64(&v["key"]),
        value: unb64(&v["value"]),
        create_revision: int(&v["create_revision"]),
        mod_revision: int(&v["mod_revision"]),
        version: int(&v["version"]),
        lease: int(&v["lease"]),
    }
}

/// A `RangeResponse`.
pub fn range_result(v: &Value) -> OpResult {
    let kvs = v["kvs"].as_array().into_iter().flatten().map(kv).collect();
    OpResult::Range { kvs, count: int(&v["count"]) as usize }
}

/// The store's revision a response's header carries.
pub fn revision(v: &Value) -> i64 {
    int(&v["header"]["revision"])
}

/// Whether an error answer (a non-200 status, or a body with `error`) says the lease is unknown: the one
/// etcd error the recipes handle as a reply. The gateway answers it as `etcdserver: requested lease not
/// found` (gRPC `NotFound`).
pub fn lease_not_found(body: &str) -> bool {
    body.contains("lease not found")
}

/// The answer to `request` from the gateway's JSON (status 200).
pub fn decode(request: &EtcdRequest, v: &Value) -> EtcdReply {
    if v.get("error").is_some_and(|e| lease_not_found(&e.to_string())) {
        return EtcdReply::Error(EtcdError::LeaseNotFound);
    }
    match request {
        EtcdRequest::Op(op) => EtcdReply::Op { revision: revision(v), result: op_result(op, v) },
        EtcdRequest::Txn { success, failure, .. } => {
            let succeeded = v["succeeded"] == json!(true);
            let ops = if succeeded { success } else { failure };
            let answers = v["responses"].as_array().cloned().unwrap_or_default();
            let results = ops
                .iter()
                .zip(answers.iter().chain(std::iter::repeat(&Value::Null)))
                .map(|(op, answer)| {
                    let field = match op {
                        Op::Range(_) => "response_range",
                        Op::Put { .. } => "response_put",
                        Op::Delete { .. } => "response_delete_range",
                    };
                    op_result(op, &answer[field])
                })
                .collect();
            EtcdReply::Txn { revision: revision(v), succeeded, results }
        }
        EtcdRequest::LeaseGrant { .. } => EtcdReply::LeaseGranted { id: int(&v["ID"]), ttl_s: int(&v["TTL"]) },
        // The keep-alive stream's answer; TTL left out (0) when the lease is gone.
        EtcdRequest::LeaseKeepAlive { id } => EtcdReply::KeepAlive { id: *id, ttl_s: int(&v["result"]["TTL"]) },
        EtcdRequest::LeaseRevoke { .. } => EtcdReply::LeaseRevoked { revision: revision(v) },
        EtcdRequest::LeaseTimeToLive { id } => {
            EtcdReply::TimeToLive { id: *id, ttl_s: int(&v["TTL"]), granted_ttl_s: int(&v["grantedTTL"]) }
        }
        EtcdRequest::Watch { .. } | EtcdRequest::CancelWatch { .. } => {
            unreachable!("a watch rides its own stream (gateway::watch_create)")
        }
    }
}

fn op_result(op: &Op, v: &Value) -> OpResult {
    match op {
        Op::Range(_) => range_result(v),
        Op::Put { .. } => OpResult::Put,
        Op::Delete { .. } => OpResult::Delete { deleted: int(&v["deleted"]) as usize },
    }
}

/// The body that opens a watch stream (`/v3/watch`) on `key` (or every key under it) from
/// `start_revision` (0: from the next change).
pub fn watch_create(key: &str, prefix: bool, start_revision: i64) -> Value {
    let mut create = key_range(key, prefix);
    if start_revision > 0 {
        create["start_revision"] = json!(start_revision.to_string());
    }
    json!({ "create_request": create })
}

/// One message of a watch stream: its header's revision and its events.
pub fn watch_message(v: &Value) -> (i64, Vec<Event>) {
    let result = &v["result"];
    let events = result["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let kind = if e["type"] == json!("DELETE") { EventType::Delete } else { EventType::Put };
            Event { kind, kv: kv(&e["kv"]) }
        })
        .collect();
    (revision(result), events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_txn_is_the_gateways_json() {
        let request = EtcdRequest::Txn {
            compare: vec![Compare { key: "m/1".into(), cmp: Cmp::Equal, target: Target::CreateRevision(0) }],
            success: vec![Op::Put { key: "m/1".into(), value: String::new(), lease: 7 }],
            failure: vec![Op::Range(Range::first_created("m/"))],
        };
        let (path, body) = encode(&request).expect("a unary call");
        assert_eq!(path, "/v3/kv/txn");
        assert_eq!(
            body,
            json!({
                "compare": [{"key": b64("m/1"), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
                "success": [{"request_put": {"key": b64("m/1"), "value": "", "lease": "7"}}],
                "failure": [{"request_range": {"key": b64("m/"), "range_end": b64("m0"), "sort_target": "CREATE",
                    "sort_order": "ASCEND", "limit": "1"}}],
            })
        );
    }

    #[test]
    fn a_failed_txn_answers_its_failure_ops_with_zero_fields_left_out() {
        let request = EtcdRequest::Txn {
            compare: vec![],
            success: vec![Op::Put { key: "k".into(), value: "v".into(), lease: 0 }],
            failure: vec![Op::Range(Range::key("k"))],
        };
        let answer = json!({
            "header": {"revision": "12"},
            "responses": [{"response_range": {"header": {}, "kvs": [{"key": b64("k"), "value": b64("x"),
                "create_revision": "3", "mod_revision": "11", "version": "4", "lease": "99"}], "count": "1"}}],
        });
        let kv = KeyValue {
            key: "k".into(),
            value: "x".into(),
            create_revision: 3,
            mod_revision: 11,
            version: 4,
            lease: 99,
        };
        let range = OpResult::Range { kvs: vec![kv], count: 1 };
        assert_eq!(decode(&request, &answer), EtcdReply::Txn { revision: 12, succeeded: false, results: vec![range] });
    }

    #[test]
    fn a_gone_lease_answers_keep_alive_with_ttl_zero_and_put_with_lease_not_found() {
        let keep_alive = EtcdRequest::LeaseKeepAlive { id: 5 };
        let answer = json!({"result": {"header": {"revision": "4"}, "ID": "5"}});
        assert_eq!(decode(&keep_alive, &answer), EtcdReply::KeepAlive { id: 5, ttl_s: 0 });
        let put = EtcdRequest::Op(Op::Put { key: "k".into(), value: "v".into(), lease: 5 });
        let error = json!({"error": "etcdserver: requested lease not found", "code": 5});
        assert_eq!(decode(&put, &error), EtcdReply::Error(EtcdError::LeaseNotFound));
    }

    #[test]
    fn a_watch_message_carries_puts_and_deletes() {
        let message = json!({"result": {"header": {"revision": "9"}, "events": [
            {"kv": {"key": b64("q/a"), "value": b64("a"), "create_revision": "8", "mod_revision": "8", "version": "1"}},
            {"type": "DELETE", "kv": {"key": b64("q/b"), "mod_revision": "9"}},
        ]}});
        let (revision, events) = watch_message(&message);
        assert_eq!(revision, 9);
        assert_eq!(events.iter().map(|e| e.kind).collect::<Vec<_>>(), [EventType::Put, EventType::Delete]);
        assert_eq!((events[1].kv.key.as_str(), events[1].kv.mod_revision), ("q/b", 9));
    }
}
