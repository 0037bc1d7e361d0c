//! Request/reply tables against the documented behaviour of Redis 7.0, and of its scripts.

use super::RedisReply::*;
use super::*;
use crate::backend::{Backend, Now, Out};

fn set(key: &str, value: &str, condition: SetCondition, px_ms: Option<i64>) -> RedisRequest {
    RedisRequest::Set { key: key.into(), value: value.into(), condition, px_ms }
}

fn key(k: &str) -> String {
    k.to_string()
}

/// redsync's delete and touch scripts (go-redsync/redsync v4 `redis.go`, as the issue quotes them).
const COMPARE_AND_DELETE: &str =
    "if redis.call(\"GET\", KEYS[1]) == ARGV[1] then return redis.call(\"DEL\", KEYS[1]) else return 0 end";
const COMPARE_AND_PEXPIRE: &str =
    "if redis.call(\"GET\", KEYS[1]) == ARGV[1] then return redis.call(\"PEXPIRE\", KEYS[1], ARGV[2]) else return 0 end";

fn eval(script: &str, keys: &[&str], args: &[&str]) -> RedisRequest {
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    RedisRequest::Eval { script: script.into(), keys: owned(keys), args: owned(args) }
}

/// Apply `(now_ms, request, expected reply)` rows in order to one server.
fn table(state: &mut RedisState, rows: Vec<(i64, RedisRequest, RedisReply)>) {
    for (i, (now, req, want)) in rows.into_iter().enumerate() {
        let got = state.apply(Now::at(now), NodeIx(0), req.clone(), &mut Out::default());
        assert_eq!(got, want, "row {i}: {req:?} at {now} ms");
    }
}

#[test]
fn set_nx_px_takes_a_free_key_and_expires_by_the_server_clock() {
    use SetCondition::*;
    table(
        &mut RedisState::default(),
        vec![
            (0, set("lock", "a", Nx, Some(5000)), Ok),
            (1, set("lock", "b", Nx, Some(5000)), Nil),
            (4999, RedisRequest::PTtl { key: key("lock") }, Int(1)),
            (4999, RedisRequest::Get { key: key("lock") }, Bulk("a".into())),
            (5000, RedisRequest::Get { key: key("lock") }, Nil),
            (5000, RedisRequest::PTtl { key: key("lock") }, Int(-2)),
            (5001, set("lock", "b", Nx, Some(5000)), Ok),
            (5002, set("lock", "c", Xx, None), Ok),
            (5003, RedisRequest::PTtl { key: key("lock") }, Int(-1)),
            (5004, set("other", "x", Xx, None), Nil),
        ],
    );
}

#[test]
fn del_and_compare_and_delete() {
    use SetCondition::*;
    let cad = |arg: &str| eval(COMPARE_AND_DELETE, &["lock"], &[arg]);
    table(
        &mut RedisState::default(),
        vec![
            (0, set("lock", "mine", Nx, Some(100)), Ok),
            (1, cad("yours"), Int(0)),
            (2, cad("mine"), Int(1)),
            (3, RedisRequest::Del { keys: vec![key("lock")] }, Int(0)),
            (4, set("lock", "theirs", Nx, Some(100)), Ok),
            // A plain DEL removes whoever's key is there: the bug of `release = "del"`.
            (5, RedisRequest::Del { keys: vec![key("lock")] }, Int(1)),
        ],
    );
}

#[test]
fn getset_pexpire_and_incr() {
    use SetCondition::*;
    let cap = |arg: &str, ms: i64| eval(COMPARE_AND_PEXPIRE, &["l"], &[arg, &ms.to_string()]);
    table(
        &mut RedisState::default(),
        vec![
            (0, RedisRequest::GetSet { key: key("l"), value: "1".into() }, Nil),
            (0, RedisRequest::GetSet { key: key("l"), value: "2".into() }, Bulk("1".into())),
            (0, RedisRequest::PExpire { key: key("missing"), ms: 10 }, Int(0)),
            (0, RedisRequest::PExpire { key: key("l"), ms: 10 }, Int(1)),
            (0, cap("1", 1000), Int(0)),
            (0, cap("2", 1000), Int(1)),
            (999, RedisRequest::Incr { key: key("l") }, Int(3)),
            (999, RedisRequest::PTtl { key: key("l") }, Int(1)),
            (0, RedisRequest::Incr { key: key("fence") }, Int(1)),
            (0, RedisRequest::Incr { key: key("fence") }, Int(2)),
            (0, set("s", "x", Always, None), Ok),
            (0, RedisRequest::Incr { key: key("s") }, Error("ERR value is not an integer or out of range".into())),
            (0, RedisRequest::PExpire { key: key("s"), ms: 0 }, Int(1)),
            (0, RedisRequest::Get { key: key("s") }, Nil),
        ],
    );
}

#[test]
fn a_forward_jump_of_the_server_clock_expires_keys_early() {
    let mut s = RedisState::default();
    table(&mut s, vec![(1_000, set("lock", "a", SetCondition::Nx, Some(30_000)), Ok)]);
    // The server's clock jumps 40 s ahead: the 30 s lock is gone after 0 s of real time.
    table(&mut s, vec![(41_000, set("lock", "b", SetCondition::Nx, Some(30_000)), Ok)]);
}

#[test]
fn writes_are_shipped_as_effects_and_a_replica_applies_them() {
    let mut master = RedisState::feeding(&[NodeIx(9)]);
    table(
        &mut master,
        vec![
            (0, set("lock", "a", SetCondition::Nx, Some(100)), Ok),
            (50, RedisRequest::Incr { key: key("fence") }, Int(1)),
            (200, RedisRequest::Get { key: key("lock") }, Nil),
        ],
    );
    let ops = master.data.backlog.take().unwrap();
    assert_eq!(
        ops,
        vec![
            ReplOp::Set { key: key("lock"), value: "a".into(), expires_at_ms: Some(100) },
            ReplOp::Set { key: key("fence"), value: "1".into(), expires_at_ms: None },
            ReplOp::Del { key: key("lock") },
        ]
    );
    let mut replica = RedisState::default();
    table(&mut replica, vec![(60, RedisRequest::Replicate { ops: ops[..2].to_vec(), offset: 2, stream: 0 }, Ok)]);
    table(&mut replica, vec![(60, RedisRequest::Get { key: key("lock") }, Bulk("a".into()))]);
}

#[test]
fn promotion_redirects_the_shard() {
    let shards = Shards::new(vec![NodeIx(1), NodeIx(3)]);
    assert_eq!(shards.promote(NodeIx(3), NodeIx(4)), Some(1));
    assert_eq!(shards.master(1), NodeIx(4));
    assert_eq!(shards.promote(NodeIx(9), NodeIx(4)), None);
}

#[test]
fn wait_answers_once_the_replica_acknowledged_the_clients_writes_or_at_its_timeout() {
    let mut master = RedisState::feeding(&[NodeIx(9)]);
    let (c1, c2, replica) = (NodeIx(1), NodeIx(2), NodeIx(9));
    let mut out = Out::default();
    let wait = RedisRequest::Wait { numreplicas: 1, timeout_ms: 1000 };
    assert_eq!(master.parks(&wait), Some(Duration::from_millis(1000)));
    master.apply(Now::at(0), c1, set("lock", "a", SetCondition::Nx, Some(10_000)), &mut out);
    assert_eq!(master.answer_parked(c1, &wait, false), None, "the replica has not acknowledged it yet");
    assert_eq!(master.answer_parked(c2, &wait, false), Some(Int(1)), "c2 wrote nothing: nothing to wait for");
    master.apply(Now::at(50), replica, RedisRequest::ReplAck { offset: 1 }, &mut out);
    assert_eq!(master.answer_parked(c1, &wait, false), Some(Int(1)));
    master.apply(Now::at(60), c1, RedisRequest::Incr { key: key("n") }, &mut out);
    assert_eq!(master.answer_parked(c1, &wait, true), Some(Int(0)), "timed out: no replica has the INCR");
    let mut alone = RedisState::default();
    alone.apply(Now::at(0), c1, set("lock", "a", SetCondition::Nx, None), &mut out);
    assert_eq!(alone.answer_parked(c1, &wait, true), Some(Int(0)), "no replica: 0 at the timeout");
}

#[test]
fn a_replica_acknowledges_each_batch_by_its_offset() {
    let mut replica = RedisState::default();
    let mut out = Out::default();
    let ops = vec![ReplOp::Set { key: key("lock"), value: "a".into(), expires_at_ms: None }];
    replica.apply(Now::at(0), NodeIx(0), RedisRequest::Replicate { ops, offset: 7, stream: 0 }, &mut out);
    let ack = out.pushes.pop().expect("an ack").1.downcast::<RedisRequest>().unwrap();
    assert_eq!(*ack, RedisRequest::ReplAck { offset: 7 });
}

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn command(args: &[&str]) -> RedisRequest {
    RedisRequest::Command { args: owned(args) }
}

/// Apply one request at time 0 from node 0.
fn apply(state: &mut RedisState, request: RedisRequest) -> RedisReply {
    state.apply(Now::at(0), NodeIx(0), request, &mut Out::default())
}

fn err(text: &str) -> RedisReply {
    Error(text.into())
}

fn bulk(text: &str) -> RedisReply {
    Bulk(text.into())
}

/// What real redis-server 7.0.15 answered to each script (run by hand with redis-cli).
#[test]
fn scripts_answer_as_redis_7_does() {
    let mut s = RedisState::default();
    apply(&mut s, command(&["SET", "s", "abc"]));
    let sha = |script: &str| sha1_hex(script);
    let rows: Vec<(&str, &[&str], RedisReply)> = vec![
        ("return redis.call('incr', KEYS[1])", &["n"], Int(1)),
        (
            "return redis.call('incr', KEYS[1])",
            &["s"],
            err(&format!(
                "ERR value is not an integer or out of range script: {}, on @user_script:1.",
                sha("return redis.call('incr', KEYS[1])")
            )),
        ),
        ("return redis.pcall('incr', KEYS[1])", &["s"], err("ERR value is not an integer or out of range")),
        (
            "local ok, e = pcall(redis.call, 'incr', KEYS[1]); return {tostring(ok), type(e), tostring(e)}",
            &["s"],
            Array(vec![bulk("false"), bulk("string"), bulk("ERR value is not an integer or out of range")]),
        ),
        ("return redis.call('nosuch')", &[], err(&format!("ERR Unknown Redis command called from script script: {}, on @user_script:1.", sha("return redis.call('nosuch')")))),
        ("return redis.call()", &[], err(&format!("ERR Please specify at least one argument for this redis lib call script: {}, on @user_script:1.", sha("return redis.call()")))),
        ("return redis.call('get', {})", &[], err(&format!("ERR Lua redis lib command arguments must be strings or integers script: {}, on @user_script:1.", sha("return redis.call('get', {})")))),
        ("return redis.call('wait', 0, 0)", &[], err(&format!("ERR This Redis command is not allowed from script script: {}, on @user_script:1.", sha("return redis.call('wait', 0, 0)")))),
        ("return nil + 1", &[], err(&format!("ERR user_script:1: attempt to perform arithmetic on a nil value script: {}, on @user_script:1.", sha("return nil + 1")))),
        ("return error('boom')", &[], err(&format!("ERR user_script:1: boom script: {}, on @user_script:1.", sha("return error('boom')")))),
        ("return error({err='My Error'})", &[], err(&format!("My Error script: {}, on @user_script:1.", sha("return error({err='My Error'})")))),
        ("x = 1", &[], err(&format!("ERR user_script:1: Attempt to modify a readonly table script: {}, on @user_script:1.", sha("x = 1")))),
        ("return y", &[], err(&format!("ERR user_script:1: Script attempted to access nonexistent global variable 'y' script: {}, on @user_script:1.", sha("return y")))),
        ("return os", &[], err(&format!("ERR user_script:1: Script attempted to access nonexistent global variable 'os' script: {}, on @user_script:1.", sha("return os")))),
        ("return redis.error_reply('oops')", &[], err("ERR oops")),
        ("return redis.error_reply('My Error')", &[], err("My Error")),
        ("return redis.status_reply('FINE')", &[], Status("FINE".into())),
        ("return redis.status_reply('OK')", &[], Ok),
        ("return {1, 2, nil, 4}", &[], Array(vec![Int(1), Int(2)])),
        ("return 3.99", &[], Int(3)),
        ("return -3.99", &[], Int(-3)),
        ("return true", &[], Int(1)),
        ("return false", &[], Nil),
        ("return redis.call('get', 'nokey')", &[], Nil),
        ("return type(redis.call('get', 'nokey'))", &[], bulk("boolean")),
        ("return redis.call('set', 'x', 'y')", &[], Ok),
        ("return redis.call('set', 'f', 1.5)", &[], Ok),
        ("redis.call('set', 'f', 0.1); return redis.call('get', 'f')", &[], bulk("0.10000000000000001")),
        ("return redis.call('set', 'f', 30000) and redis.call('get', 'f')", &[], bulk("30000")),
        ("return {redis.call('ping'), redis.call('exists', 'a', 's', 's')}", &[], Array(vec![Status("PONG".into()), Int(2)])),
        ("return redis.sha1hex('')", &[], bulk("da39a3ee5e6b4b0d3255bfef95601890afd80709")),
        ("return {KEYS[1], #KEYS, #ARGV, ARGV[1], 5}", &["k"], Array(vec![bulk("k"), Int(1), Int(0)])),
        ("if x then", &[], err("ERR Error compiling script (new function): user_script:1: 'end' expected near '<eof>'")),
        ("#!lua flags=no-writes\nreturn 2", &[], Int(2)),
    ];
    for (script, keys, want) in rows {
        let got = apply(&mut s, eval(script, keys, &[]));
        assert_eq!(got, want, "{script}");
    }
}

#[test]
fn math_random_is_redis_rand48_from_the_start_of_the_server() {
    // A fresh redis-server 7.0.15 answered 0, 9 and then "0.35333609737146".
    let mut s = RedisState::default();
    assert_eq!(apply(&mut s, eval("return {math.random(), math.random(10)}", &[], &[])), Array(vec![Int(0), Int(9)]));
    assert_eq!(apply(&mut s, eval("return tostring(math.random())", &[], &[])), bulk("0.35333609737146"));
    // tostring shows no address: the same script gives the same text in every run.
    let shown = apply(&mut s, eval("return tostring({})", &[], &[]));
    assert_eq!(shown, bulk("table: 0x00000001"));
}

#[test]
fn evalsha_runs_a_loaded_script_and_a_restart_forgets_it() {
    let mut s = RedisState::default();
    let script = "return ARGV[1] .. KEYS[1]";
    let loaded = apply(&mut s, RedisRequest::ScriptLoad { script: script.into() });
    assert_eq!(loaded, bulk(&sha1_hex(script)));
    let by_sha = |sha: &str| RedisRequest::EvalSha { sha: sha.into(), keys: owned(&["k"]), args: owned(&["a"]) };
    assert_eq!(apply(&mut s, by_sha(&sha1_hex(script).to_uppercase())), bulk("ak"));
    let noscript = err("NOSCRIPT No matching script. Please use EVAL.");
    assert_eq!(apply(&mut s, by_sha("0123456789012345678901234567890123456789")), noscript);
    assert_eq!(apply(&mut s, command(&["EVALSHA", "abc", "0"])), noscript);
    s.restart();
    assert_eq!(apply(&mut s, by_sha(&sha1_hex(script))), noscript, "the script cache is not persisted");
    assert_eq!(apply(&mut s, eval(script, &["k"], &["b"])), bulk("bk"));
    assert_eq!(apply(&mut s, by_sha(&sha1_hex(script))), bulk("ak"), "EVAL caches the script too");
}

#[test]
fn command_lines_are_checked_as_redis_checks_them() {
    let mut s = RedisState::default();
    let rows: Vec<(&[&str], RedisReply)> = vec![
        (&["get"], err("ERR wrong number of arguments for 'get' command")),
        (&["nosuch", "a", "b"], err("ERR unknown command 'nosuch', with args beginning with: 'a' 'b' ")),
        (&["SET", "k", "v", "NX", "XX"], err("ERR syntax error")),
        (&["SET", "k", "v", "PX", "0"], err("ERR invalid expire time in 'set' command")),
        (&["SET", "k", "v", "PX", "1x"], err("ERR value is not an integer or out of range")),
        (&["set", "k", "v", "px", "100", "nx"], Ok),
        (&["PTTL", "k"], Int(100)),
        (&["HSET", "h", "f"], err("ERR wrong number of arguments for 'hset' command")),
        (&["HSET", "h", "f", "1", "g", "2", "f", "3"], Int(2)),
        (&["EVAL", "return 1", "2", "a"], err("ERR Number of keys can't be greater than number of args")),
        (&["EVAL", "return 1", "-1"], err("ERR Number of keys can't be negative")),
        (&["EVAL", "return #KEYS + 10 * #ARGV", "1", "a", "b", "c"], Int(21)),
        (&["SCRIPT", "FLUSH"], err("ERR unknown subcommand 'FLUSH'. Try SCRIPT HELP.")),
        (&["INCR", "007"], Int(1)),
        (&["SET", "n", "007"], Ok),
        (&["INCR", "n"], err("ERR value is not an integer or out of range")),
    ];
    for (args, want) in rows {
        assert_eq!(apply(&mut s, command(args)), want, "{args:?}");
    }
}

#[test]
fn typed_requests_and_their_command_lines_are_the_same_request() {
    let requests = vec![
        RedisRequest::Set { key: key("k"), value: "v".into(), condition: SetCondition::Nx, px_ms: Some(5) },
        RedisRequest::Del { keys: owned(&["a", "b"]) },
        RedisRequest::HSet { key: key("h"), pairs: vec![(key("f"), key("1"))] },
        RedisRequest::HIncrBy { key: key("h"), field: key("f"), by: -1 },
        RedisRequest::HDel { key: key("h"), fields: owned(&["f", "g"]) },
        RedisRequest::Publish { channel: key("c"), message: key("0") },
        eval("return 1", &["k1", "k2"], &["a"]),
        RedisRequest::EvalSha { sha: key("ab"), keys: vec![], args: owned(&["x"]) },
        RedisRequest::ScriptLoad { script: key("return 1") },
        RedisRequest::Wait { numreplicas: 1, timeout_ms: 100 },
    ];
    for r in requests {
        assert_eq!(RedisRequest::parse(&r.to_args()), std::result::Result::Ok(r.clone()), "{r:?}");
    }
}

#[test]
fn hashes_count_their_fields_and_refuse_string_commands() {
    let wrongtype = err("WRONGTYPE Operation against a key holding the wrong kind of value");
    let mut s = RedisState::default();
    let rows: Vec<(&[&str], RedisReply)> = vec![
        (&["HINCRBY", "h", "owner:1", "1"], Int(1)),
        (&["HINCRBY", "h", "owner:1", "1"], Int(2)),
        (&["HEXISTS", "h", "owner:1"], Int(1)),
        (&["HEXISTS", "h", "owner:2"], Int(0)),
        (&["HGET", "h", "owner:1"], bulk("2")),
        (&["HGET", "h", "nope"], Nil),
        (&["GET", "h"], wrongtype.clone()),
        (&["INCR", "h"], wrongtype.clone()),
        (&["GETSET", "h", "x"], wrongtype.clone()),
        (&["EXISTS", "h"], Int(1)),
        (&["PEXPIRE", "h", "1000"], Int(1)),
        (&["HSET", "h", "other", "x"], Int(1)),
        (&["PTTL", "h"], Int(1000)),
        (&["HINCRBY", "h", "other", "1"], err("ERR hash value is not an integer")),
        (&["HINCRBY", "h", "owner:1", "x"], err("ERR value is not an integer or out of range")),
        (&["HINCRBY", "h", "owner:1", "9223372036854775807"], err("ERR increment or decrement would overflow")),
        (&["HDEL", "h", "owner:1", "nope"], Int(1)),
        (&["HDEL", "h", "other"], Int(1)),
        (&["EXISTS", "h"], Int(0)),
        (&["SET", "s", "v"], Ok),
        (&["HSET", "s", "f", "v"], wrongtype.clone()),
        (&["HGET", "s", "f"], wrongtype.clone()),
        (&["HDEL", "s", "f"], wrongtype.clone()),
        (&["HEXISTS", "s", "f"], wrongtype),
        (&["DEL", "s", "h", "s"], Int(1)),
    ];
    for (args, want) in rows {
        assert_eq!(apply(&mut s, command(args)), want, "{args:?}");
    }
}

#[test]
fn a_scripts_effects_are_replicated_as_effects_in_one_batch() {
    let mut master = RedisState::feeding(&[NodeIx(9)]);
    let script = "redis.call('hincrby', KEYS[1], ARGV[1], 1); redis.call('pexpire', KEYS[1], 500); return 1";
    assert_eq!(master.apply(Now::at(100), NodeIx(1), eval(script, &["l"], &["me"]), &mut Out::default()), Int(1));
    let ops = master.data.backlog.take().unwrap();
    let hash = Value::Hash([(key("me"), key("1"))].into());
    assert_eq!(
        ops,
        vec![
            ReplOp::Set { key: key("l"), value: hash.clone(), expires_at_ms: None },
            ReplOp::Set { key: key("l"), value: hash, expires_at_ms: Some(600) },
        ]
    );
    assert_eq!(master.data.written[&NodeIx(1)], 2, "WAIT after the script waits for both");
    // An error half way leaves what ran before it (Redis does not roll scripts back).
    let half = "redis.call('set', KEYS[1], 'x'); return redis.call('hget', KEYS[1], 'f')";
    assert!(matches!(apply(&mut master, eval(half, &["s"], &[])), Error(_)));
    assert_eq!(apply(&mut master, RedisRequest::Get { key: key("s") }), bulk("x"));
}

#[test]
fn publish_pushes_to_each_subscribed_node_and_a_restart_ends_subscriptions() {
    let mut s = RedisState::default();
    let (c1, c2) = (NodeIx(1), NodeIx(2));
    let mut out = Out::default();
    let sub = |channel: &str| RedisRequest::Subscribe { channel: channel.into() };
    let publish = RedisRequest::Publish { channel: key("ch"), message: key("0") };
    let confirm = |n| Array(vec![bulk("subscribe"), bulk("ch"), Int(n)]);
    assert_eq!(s.apply(Now::at(0), c1, sub("ch"), &mut out), confirm(1));
    assert_eq!(s.apply(Now::at(0), c1, sub("ch"), &mut out), confirm(1), "once per connection");
    assert_eq!(s.apply(Now::at(0), c2, sub("ch"), &mut out), confirm(1));
    // From a script too, as Redisson's unlock publishes.
    let unlock = "return redis.call(ARGV[2], KEYS[1], ARGV[1])";
    assert_eq!(s.apply(Now::at(0), c1, eval(unlock, &["ch"], &["0", "publish"]), &mut out), Int(2));
    let pushed: Vec<NodeIx> = out.pushes.iter().map(|(to, _)| *to).collect();
    assert_eq!(pushed, vec![c1, c2]);
    let message = out.pushes.pop().unwrap().1.downcast::<PubSubMessage>().unwrap();
    assert_eq!(*message, PubSubMessage { channel: key("ch"), message: key("0") });
    assert_eq!(out.events.len(), 2, "each subscriber is notified (the herd count)");
    let gone = Array(vec![bulk("unsubscribe"), bulk("ch"), Int(0)]);
    assert_eq!(s.apply(Now::at(0), c2, RedisRequest::Unsubscribe { channel: key("ch") }, &mut out), gone);
    assert_eq!(apply(&mut s, publish.clone()), Int(1));
    s.restart();
    assert_eq!(apply(&mut s, publish), Int(0), "a restarted server has no subscribers");
}

#[test]
fn numbers_reach_redis_as_printf_17g() {
    for (x, want) in [
        (30000.0, "30000"),
        (0.1, "0.10000000000000001"),
        (1.5, "1.5"),
        (-2.0, "-2"),
        (1e17, "1e+17"),
        (123456789012345680.0, "1.2345678901234568e+17"),
        (0.0001, "0.0001"),
        (0.00001, "1.0000000000000001e-05"),
        (f64::INFINITY, "inf"),
    ] {
        assert_eq!(format_g17(x), want, "{x}");
    }
}

#[test]
fn a_script_that_never_ends_is_stopped_by_the_models_bound() {
    let mut s = RedisState::default();
    let reply = apply(&mut s, eval("while true do end", &[], &[]));
    assert!(matches!(&reply, Error(e) if e.contains("instructions")), "{reply:?}");
    assert_eq!(apply(&mut s, eval("return 1", &[], &[])), Int(1), "the VM runs on");
}

/// A subscriber on one node, a publisher on another, and the server: what the subscriber received
/// (message, ms), and what each PUBLISH answered, under `faults`.
fn pubsub_world(faults: Vec<crate::fault::Fault>) -> (Vec<(String, u64)>, Vec<RedisReply>) {
    use crate::clock::sim_now_ns;
    use crate::world::{Program, World};
    use client::{Router, Subscription};
    use std::rc::Rc;
    use std::sync::{Arc, Mutex};
    let (got, answers) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (got2, answers2) = (got.clone(), answers.clone());
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let mut world = World::new(1);
        let node = RedisNode {
            state: Arc::default(),
            persist: true,
            replicas: vec![],
            lag: Duration::ZERO,
            master: None,
            managed: None,
            sentinels: Default::default(),
        };
        let server = world.add_node("redis-0", Arc::new(move |env| Box::pin(node.clone().run(env))));
        let subscriber: Program = Arc::new(move |env| {
            let got = got2.clone();
            Box::pin(async move {
                let rpc = env.rpc();
                let router = Rc::new(Router::default());
                let timeout = Duration::from_secs(1);
                let mut sub = Subscription::open(&rpc, &router, server, "ch", timeout).await.expect("subscribed");
                loop {
                    let m = sub.message().await;
                    got.lock().unwrap().push((m, sim_now_ns() / 1_000_000));
                }
            })
        });
        world.add_node("client-0", subscriber);
        let publisher: Program = Arc::new(move |env| {
            let answers = answers2.clone();
            Box::pin(async move {
                let rpc = env.rpc();
                for (at_s, message) in [(1, "before"), (3, "during"), (10, "after-restart")] {
                    madsim::time::sleep(Duration::from_secs(at_s) - Duration::from_nanos(sim_now_ns())).await;
                    let publish = RedisRequest::Publish { channel: "ch".into(), message: message.into() };
                    let reply: RedisReply = rpc.call(server, publish, Duration::from_secs(1)).await.unwrap();
                    answers.lock().unwrap().push(reply);
                }
            })
        });
        world.add_node("client-1", publisher);
        world.run(&faults, Duration::from_secs(12)).await;
    });
    let result = (got.lock().unwrap().clone(), answers.lock().unwrap().clone());
    result
}

#[test]
fn a_partition_delays_published_messages_and_a_restart_loses_the_subscription() {
    use crate::fault::{Action, Fault, Target};
    let partition = Fault {
        at: Duration::from_secs(2),
        target: Target::Node("client-0".into()),
        action: Action::Partition { peers: vec!["redis-0".into()], duration: Some(Duration::from_secs(3)) },
        on: None,
    };
    let restart =
        Fault { at: Duration::from_secs(8), target: Target::Node("redis-0".into()), action: Action::Restart, on: None };
    let (got, answers) = pubsub_world(vec![partition, restart]);
    assert_eq!(answers, vec![Int(1), Int(1), Int(0)], "the restarted server has no subscriber");
    let (messages, times): (Vec<String>, Vec<u64>) = got.into_iter().unzip();
    assert_eq!(messages, vec!["before", "during"], "nothing after the restart");
    assert!(times[0] < 1_100, "{times:?}");
    assert!(times[1] >= 5_000, "held during the cut, delivered after the heal: {times:?}");
}

#[test]
fn an_expired_lock_key_ends_its_setters_lease_and_a_new_set_starts_the_next() {
    let mut state = RedisState::default();
    let (a, b) = (NodeIx(1), NodeIx(2));
    let mut out = Out::default();
    state.apply(Now::at(0), a, set("lock", "a", SetCondition::Nx, Some(5_000)), &mut out);
    let lease = crate::history::fnv1a(b"lock");
    assert_eq!(out.leases, vec![(a, lease, true)]);
    out.leases.clear();
    state.apply(Now::at(4_999), b, set("lock", "b", SetCondition::Nx, Some(5_000)), &mut out);
    assert!(out.leases.is_empty(), "still a's: b's SET NX failed and nothing expired");
    state.apply(Now::at(5_000), b, set("lock", "b", SetCondition::Nx, Some(5_000)), &mut out);
    assert_eq!(out.leases, vec![(a, lease, false), (b, lease, true)], "a's key expired, then b took it");
}

#[test]
fn a_replica_missing_a_lock_key_is_what_a_failover_would_lose() {
    let mut master = RedisState::feeding(&[NodeIx(9)]);
    let replica = RedisState::default();
    let mut out = Out::default();
    master.apply(Now::at(0), NodeIx(1), RedisRequest::Incr { key: key("fence") }, &mut out);
    assert_eq!(master.lock_keys_missing_from(&replica), 0, "the fence has no expiry: not a lock key");
    master.apply(Now::at(0), NodeIx(1), set("lock", "a", SetCondition::Nx, Some(5_000)), &mut out);
    assert_eq!(master.lock_keys_missing_from(&replica), 1);
}

fn batch(sent_ns: u64, offset: u64, key_name: &str) -> Shipped {
    let ops = vec![ReplOp::Set { key: key(key_name), value: "v".into(), expires_at_ms: Some(10_000) }];
    Shipped { sent_ns, stream: 0, offset, ops }
}

#[test]
fn a_replica_applies_each_batch_once_and_a_promoted_one_follows_no_stream() {
    let mut replica = RedisState::default();
    let mut out = Out::default();
    let b = batch(0, 1, "a");
    let replicate = |b: &Shipped| RedisRequest::Replicate { ops: b.ops.clone(), offset: b.offset, stream: b.stream };
    replica.promote(vec![b.clone()]);
    table(&mut replica, vec![(1, RedisRequest::Get { key: key("a") }, Bulk("v".into()))]);
    table(&mut replica, vec![(2, RedisRequest::Del { keys: vec![key("a")] }, Int(1))]);
    // The same batch arrives after the promotion: the old master's stream no longer counts.
    replica.apply(Now::at(3), NodeIx(0), replicate(&b), &mut out);
    replica.apply(Now::at(3), NodeIx(0), replicate(&batch(0, 2, "b")), &mut out);
    table(&mut replica, vec![(4, RedisRequest::Exists { keys: vec![key("a"), key("b")] }, Int(0))]);
    assert!(out.pushes.is_empty(), "a promoted server acknowledges nothing");

    let mut follower = RedisState::default();
    follower.apply(Now::at(0), NodeIx(0), replicate(&batch(0, 2, "c")), &mut out);
    table(&mut follower, vec![(1, RedisRequest::Del { keys: vec![key("c")] }, Int(1))]);
    follower.apply(Now::at(2), NodeIx(0), replicate(&batch(0, 2, "c")), &mut out);
    table(&mut follower, vec![(3, RedisRequest::Exists { keys: vec![key("c")] }, Int(0))]);
    let restarted = Shipped { stream: 1, ..batch(0, 1, "c") };
    follower.apply(Now::at(4), NodeIx(0), replicate(&restarted), &mut out);
    table(&mut follower, vec![(5, RedisRequest::Exists { keys: vec![key("c")] }, Int(1))]);
}

#[test]
fn what_was_on_the_wire_reaches_the_promoted_replica_and_what_a_cut_held_does_not() {
    let mut master = RedisState::feeding(&[NodeIx(9)]);
    master.data.shipped = vec![batch(1_000, 1, "before-the-cut"), batch(5_000, 2, "during-the-cut")];
    let mut out = Out::default();
    assert_eq!(master.on_the_wire(None).len(), 2, "a healthy link: everything sent is on its way");
    assert_eq!(master.on_the_wire(Some(5_000)), vec![batch(1_000, 1, "before-the-cut")]);
    master.apply(Now::at(0), NodeIx(9), RedisRequest::ReplAck { offset: 1 }, &mut out);
    assert_eq!(master.on_the_wire(None), vec![batch(5_000, 2, "during-the-cut")], "acknowledged: delivered");
}

/// A master and its replica with `lag`, and a client that sets a key at 1 s: when the replica has it
/// (ms), if by 3 s.
fn replica_has_key_at(lag: Duration) -> Option<u64> {
    use crate::clock::sim_now_ns;
    use crate::world::{Program, World};
    use std::sync::{Arc, Mutex};
    let replica_state: Arc<Mutex<RedisState>> = Arc::default();
    let seen = Arc::new(Mutex::new(None));
    let (watch, seen2) = (replica_state.clone(), seen.clone());
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let mut world = World::new(1);
        let replica_ix = NodeIx(1);
        let master = RedisNode {
            state: Arc::new(Mutex::new(RedisState::feeding(&[replica_ix]))),
            persist: true,
            replicas: vec![replica_ix],
            lag,
            master: None,
            managed: None,
            sentinels: Default::default(),
        };
        let server = world.add_node("redis-0", Arc::new(move |env| Box::pin(master.clone().run(env))));
        let replica = RedisNode {
            state: replica_state,
            persist: true,
            replicas: vec![],
            lag: Duration::ZERO,
            master: Some(server),
            managed: None,
            sentinels: Default::default(),
        };
        world.add_node("redis-0-replica", Arc::new(move |env| Box::pin(replica.clone().run(env))));
        let client: Program = Arc::new(move |env| {
            let (watch, seen) = (watch.clone(), seen2.clone());
            Box::pin(async move {
                let rpc = env.rpc();
                madsim::time::sleep(Duration::from_secs(1)).await;
                let set = set("lock", "a", SetCondition::Nx, Some(10_000));
                let _: RedisReply = rpc.call(server, set, Duration::from_secs(1)).await.unwrap();
                loop {
                    let mut out = Out::default();
                    let get = RedisRequest::Get { key: key("lock") };
                    if watch.lock().unwrap().apply(Now::at(1_000), NodeIx(9), get, &mut out) != Nil {
                        seen.lock().unwrap().get_or_insert(sim_now_ns() / 1_000_000);
                        return;
                    }
                    madsim::time::sleep(Duration::from_millis(1)).await;
                }
            })
        });
        world.add_node("client-0", client);
        world.run(&[], Duration::from_secs(3)).await;
    });
    let at = *seen.lock().unwrap();
    at
}

#[test]
fn a_healthy_replica_link_carries_each_write_at_once_and_a_slow_one_after_its_lag() {
    let at = replica_has_key_at(Duration::ZERO).expect("replicated");
    // Sent with the reply: one network delay (1–10 ms) after the master applied it at 1 s + 1–10 ms.
    assert!((1_002..=1_021).contains(&at), "{at} ms");
    let slow = replica_has_key_at(Duration::from_millis(500)).expect("replicated");
    assert!((1_502..=1_521).contains(&slow), "{slow} ms");
}

/// A master (keeping its dataset across a restart or not) and a replica that forgets its own; a client
/// sets a key at 1 s, then `crashed` crashes at 2 s for 1 s: whether the replica has the key at 5 s.
fn replica_has_key_after_restart(crashed: &str, master_persists: bool) -> bool {
    use crate::fault::{Action, Fault, Target};
    use crate::world::{Program, World};
    use std::sync::{Arc, Mutex};
    let replica_state: Arc<Mutex<RedisState>> = Arc::default();
    let watch = replica_state.clone();
    let crash = Fault {
        at: Duration::from_secs(2),
        target: Target::Node(crashed.into()),
        action: Action::Crash { restart_after: Some(Duration::from_secs(1)), host: false },
        on: None,
    };
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let mut world = World::new(1);
        let state = Arc::new(Mutex::new(RedisState::feeding(&[NodeIx(1)])));
        let lag = Duration::ZERO;
        let master = RedisNode {
            state,
            persist: master_persists,
            replicas: vec![NodeIx(1)],
            lag,
            master: None,
            managed: None,
            sentinels: Default::default(),
        };
        let server = world.add_node("redis-0", Arc::new(move |env| Box::pin(master.clone().run(env))));
        let replica = RedisNode {
            state: replica_state,
            persist: false,
            replicas: vec![],
            lag: Duration::ZERO,
            master: Some(server),
            managed: None,
            sentinels: Default::default(),
        };
        world.add_node("redis-0-replica", Arc::new(move |env| Box::pin(replica.clone().run(env))));
        let client: Program = Arc::new(move |env| {
            Box::pin(async move {
                let rpc = env.rpc();
                madsim::time::sleep(Duration::from_secs(1)).await;
                let set = set("lock", "a", SetCondition::Nx, Some(100_000));
                let _: RedisReply = rpc.call(server, set, Duration::from_secs(1)).await.unwrap();
            })
        });
        world.add_node("client-0", client);
        world.run(&[crash], Duration::from_secs(5)).await;
    });
    let mut out = Out::default();
    let get = RedisRequest::Get { key: key("lock") };
    let has = watch.lock().unwrap().apply(Now::at(5_000), NodeIx(9), get, &mut out) != Nil;
    has
}

#[test]
fn a_restarted_replica_catches_up_by_a_full_resync_and_an_empty_master_empties_it() {
    assert!(replica_has_key_after_restart("redis-0", true), "the master's dataset survives: no loss");
    assert!(replica_has_key_after_restart("redis-0-replica", false), "the replica restarted empty, then resynced");
    // The replication docs' warning: a master restarted without persistence syncs its replica empty.
    assert!(!replica_has_key_after_restart("redis-0", false), "the replica loaded the master's empty dataset");
}

#[test]
fn a_full_resync_replaces_the_replicas_dataset() {
    let mut master = RedisState::feeding(&[NodeIx(9)]);
    let mut out = Out::default();
    master.apply(Now::at(0), NodeIx(1), set("lock", "a", SetCondition::Nx, Some(5_000)), &mut out);
    let mut replica = RedisState::default();
    replica.apply(Now::at(0), NodeIx(1), set("stale", "x", SetCondition::Always, None), &mut out);
    let replicate = RedisRequest::Replicate { ops: master.data.snapshot(), offset: 1, stream: 1 };
    replica.apply(Now::at(1), NodeIx(0), replicate, &mut out);
    table(&mut replica, vec![(2, RedisRequest::Get { key: key("lock") }, Bulk("a".into()))]);
    table(&mut replica, vec![(2, RedisRequest::Exists { keys: vec![key("stale")] }, Int(0))]);
}

/// A server under Sentinel with `min-replicas-to-write 1`, `min-replicas-max-lag 10`.
fn managed_master() -> RedisState {
    let mut state = RedisState::feeding(&[NodeIx(1)]);
    state.managed = Some(Managed { min_replicas_to_write: 1, min_replicas_max_lag: Duration::from_secs(10) });
    state
}

fn ack(state: &mut RedisState, now_ms: i64) {
    state.apply(Now::at(now_ms), NodeIx(1), RedisRequest::ReplAck { offset: 0 }, &mut Out::default());
}

/// `replicationCron` on the master: it recounts its good replicas.
fn cron(state: &mut RedisState, now_ms: i64) {
    state.tick(Now::at(now_ms), &mut Out::default());
}

/// `min-replicas-max-lag` counts whole seconds of the master's clock since the replica's last
/// acknowledgement; a write, and each write a script makes, is refused past it; reads are not. The
/// count is the one the master last made: when the replica came online (its first acknowledgement)
/// and once a second (`replicationCron`), not at each acknowledgement.
#[test]
fn a_master_without_a_good_replica_refuses_writes() {
    use SetCondition::*;
    let mut master = managed_master();
    let refused = Error(NOREPLICAS.into());
    table(&mut master, vec![(0, set("lock", "a", Nx, Some(60_000)), refused.clone())]);
    ack(&mut master, 1_900);
    table(&mut master, vec![(2_000, set("lock", "a", Nx, Some(60_000)), Ok)]);
    // Acknowledged in second 1: good up to second 11 (11 - 1 <= 10), not from second 12.
    cron(&mut master, 11_999);
    table(&mut master, vec![(11_999, RedisRequest::Incr { key: key("n") }, Int(1))]);
    // Until the next count, the last one stands.
    table(&mut master, vec![(12_000, RedisRequest::Incr { key: key("n") }, Int(2))]);
    cron(&mut master, 12_000);
    table(
        &mut master,
        vec![
            (12_000, RedisRequest::Incr { key: key("n") }, refused.clone()),
            (12_000, RedisRequest::Get { key: key("lock") }, Bulk("a".into())),
            (12_000, eval(COMPARE_AND_DELETE, &["lock"], &["b"]), Int(0)),
        ],
    );
    // The script's DEL is refused, and so the script fails, as a script's error reads.
    let script =
        master.apply(Now::at(12_000), NodeIx(0), eval(COMPARE_AND_DELETE, &["lock"], &["a"]), &mut Out::default());
    assert!(matches!(&script, Error(e) if e.starts_with(NOREPLICAS)), "{script:?}");
    // A late acknowledgement counts at the next count, not before.
    ack(&mut master, 12_500);
    table(&mut master, vec![(12_600, RedisRequest::Del { keys: vec![key("lock")] }, refused.clone())]);
    cron(&mut master, 13_000);
    table(&mut master, vec![(13_000, RedisRequest::Del { keys: vec![key("lock")] }, Int(1))]);
}

/// A replica that leaves its master (`REPLICAOF` another, or `NO ONE`) closes its link; the master,
/// reading the connection's end after what the link held, frees it and counts again at once: an
/// acknowledgement that a cut held back and that arrives just before the close never makes the master
/// take writes, and a freed replica is no longer counted (`INFO replication`) nor fed.
#[test]
fn a_replica_that_leaves_is_freed_and_no_longer_counts() {
    use SetCondition::*;
    let mut master = managed_master();
    ack(&mut master, 0);
    cron(&mut master, 15_000);
    table(&mut master, vec![(15_000, set("lock", "a", Nx, None), Error(NOREPLICAS.into()))]);
    // The cut heals: the acknowledgements the link held — a write between them and the close is still
    // refused — then the replica's close.
    ack(&mut master, 15_100);
    table(&mut master, vec![(15_100, set("lock", "a", Nx, None), Error(NOREPLICAS.into()))]);
    master.apply(Now::at(15_100), NodeIx(1), RedisRequest::ReplClose, &mut Out::default());
    table(
        &mut master,
        vec![
            (15_100, set("lock", "a", Nx, None), Error(NOREPLICAS.into())),
            (15_100, RedisRequest::InfoReplicas, Int(0)),
        ],
    );
    cron(&mut master, 16_000);
    table(&mut master, vec![(16_000, set("lock", "a", Nx, None), Error(NOREPLICAS.into()))]);
}

/// `REPLICAOF m` makes a master a read-only replica that asks `m` for a full resynchronisation;
/// `REPLICAOF NO ONE` makes it a master again, which takes writes.
#[test]
fn replicaof_turns_a_master_into_a_replica_and_back() {
    use SetCondition::*;
    let managed = Some(Managed { min_replicas_to_write: 0, min_replicas_max_lag: Duration::from_secs(10) });
    let mut state = RedisState { managed, ..RedisState::default() };
    let mut out = Out::default();
    let new_master = NodeIx(7);
    assert_eq!(state.apply(Now::at(0), NodeIx(9), RedisRequest::ReplicaOf { master: Some(new_master) }, &mut out), Ok);
    let asked: Vec<_> =
        out.pushes.drain(..).map(|(to, m)| (to, *m.downcast::<RedisRequest>().expect("a request"))).collect();
    assert_eq!(asked, vec![(new_master, RedisRequest::ReplSync)]);
    table(&mut state, vec![(1, set("lock", "a", Nx, None), Error(READONLY.into()))]);
    // The stream of another master is not this replica's.
    let stray = RedisRequest::Replicate {
        ops: vec![ReplOp::Set { key: key("lock"), value: "x".into(), expires_at_ms: None }],
        offset: 1,
        stream: 0,
    };
    state.apply(Now::at(2), NodeIx(3), stray, &mut Out::default());
    table(&mut state, vec![(3, RedisRequest::Get { key: key("lock") }, Nil)]);
    // Promoted, it closes its link to the master it followed.
    let mut out = Out::default();
    state.apply(Now::at(4), NodeIx(9), RedisRequest::ReplicaOf { master: None }, &mut out);
    let closed: Vec<_> =
        out.pushes.drain(..).map(|(to, m)| (to, *m.downcast::<RedisRequest>().expect("a request"))).collect();
    assert_eq!(closed, vec![(new_master, RedisRequest::ReplClose)]);
    table(&mut state, vec![(5, set("lock", "a", Nx, None), Ok)]);
}

/// A probe from a Sentinel is answered by a pushed PONG, with the role when INFO was asked.
#[test]
fn a_sentinels_probe_is_answered_with_the_role() {
    let mut state = managed_master();
    let mut out = Out::default();
    let sentinel = NodeIx(5);
    state.apply(Now::at(0), sentinel, RedisRequest::Sentinel(sentinel::SentinelMsg::Probe { info: true }), &mut out);
    let (to, msg) = out.pushes.pop().expect("an answer");
    let role = Some(sentinel::Role { replica_of: None, offset: 0 });
    assert_eq!(
        (to, *msg.downcast::<RedisRequest>().expect("a request")),
        (sentinel, RedisRequest::Sentinel(sentinel::SentinelMsg::Probed { role }))
    );
}

/// Sentinel's `REPLICAOF` comes with `CLIENT KILL TYPE normal` and `TYPE pubsub`: every client's
/// connection is closed — not a replica's link, not a Sentinel's — and a client that comes back is
/// tracked afresh.
#[test]
fn a_sentinels_replicaof_closes_every_clients_connection() {
    use crate::net::Connection;
    let mut state = managed_master();
    let mut out = Out::default();
    let (a, b) = (Connection::on(NodeIx(7), 1), Connection::on(NodeIx(8), 2));
    let sentinel = Connection::on(NodeIx(5), 3);
    let replica = Connection::on(NodeIx(1), 4);
    state.apply_via(Now::at(0), a, RedisRequest::Get { key: "k".into() }, &mut out);
    state.apply_via(Now::at(0), b, RedisRequest::Subscribe { channel: "c".into() }, &mut out);
    state.apply_via(Now::at(0), replica, RedisRequest::ReplAck { offset: 0 }, &mut out);
    let probe = RedisRequest::Sentinel(sentinel::SentinelMsg::Probe { info: false });
    state.apply_via(Now::at(0), sentinel, probe, &mut out);
    assert!(out.closes.is_empty());
    state.apply_via(Now::at(1), sentinel, RedisRequest::ReplicaOf { master: Some(NodeIx(2)) }, &mut out);
    assert_eq!(out.closes, vec![a, b]);
    // Already following it: the connections are closed all the same (the transaction's CLIENT KILL).
    out.closes.clear();
    state.apply_via(Now::at(2), a, RedisRequest::Get { key: "k".into() }, &mut out);
    state.apply_via(Now::at(3), sentinel, RedisRequest::ReplicaOf { master: Some(NodeIx(2)) }, &mut out);
    assert_eq!(out.closes, vec![a]);
}
