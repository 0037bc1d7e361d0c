//! Scripts: Lua 5.1, as Redis 7.0 embeds it (`src/eval.c`, `src/script_lua.c`).
//!
//! - One VM per server life, made at the first script; compiled functions are cached by the SHA1 of
//!   their text (`SCRIPT LOAD`, `EVALSHA`), and forgotten with the VM when the server restarts (Redis
//!   never persists its script cache).
//! - A script runs inside one request: nothing else happens on the server meanwhile (Redis runs
//!   scripts atomically). Its `redis.call`s go through the same command path as clients' commands,
//!   so their effects are replicated as effects, as Redis 7 does.
//! - `KEYS` and `ARGV` are tables of strings. `redis.call` raises a command's error, `redis.pcall`
//!   returns it as `{err = …}`; `redis.status_reply`, `redis.error_reply`, `redis.sha1hex`, the
//!   read-only globals, Redis's `pcall` and its `math.random` are those of Redis 7.0 (`prelude.lua`).
//! - Conversions: a reply becomes an integer → number, bulk → string, nil → false, status →
//!   `{ok = …}`, error → `{err = …}`, array → table; a script's result becomes a number → integer
//!   (truncated), string → bulk, table → array up to its first nil (or a status or error for `{ok}`,
//!   `{err}`), true → 1, false and nil → nil.
//! - Left out: `cjson`, `bit`, `struct`, `cmsgpack` (a script using them reads a nonexistent global),
//!   RESP3, script flags, `SCRIPT FLUSH`/`EXISTS`/`KILL`. Tables inside the globals (`string`,
//!   `redis`) can be written, which Redis 7.0 forbids. A script that runs past
//!   [`INSTRUCTION_BUDGET`] is stopped with an error (Redis would run it to the end).
//! - Deterministic: no `os` or `io`, `math.random` is Redis's seeded rand48, and `tostring` numbers
//!   tables and functions rather than showing their addresses.

use super::data::Data;
use super::RedisReply;
use crate::backend::Out;
use crate::history::NodeIx;
use mlua::{Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value, VmState};
use std::collections::BTreeMap;

/// Lua instructions one script may run before the model stops it (a bound, not a Redis rule).
pub const INSTRUCTION_BUDGET: u64 = 100_000_000;
const HOOK_EVERY: u32 = 1_000_000;

/// What a running script's primitives act on: the dataset and the request's outbox, lent to the VM
/// for the script's run.
struct ScriptRun {
    data: Data,
    out: Out,
    now_ms: i64,
    from: NodeIx,
    instructions: u64,
}

/// The Lua VM of one server life and its compiled scripts.
pub(super) struct Scripting {
    lua: Lua,
    run: Function,
    env: Table,
    scripts: BTreeMap<String, Function>,
    /// The SHA1 of each script text seen, so an `EVAL` of a known text is not hashed again.
    shas: BTreeMap<String, String>,
}

impl std::fmt::Debug for Scripting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripting").field("scripts", &self.scripts.keys()).finish()
    }
}

/// The SHA1 of a script's text, in lowercase hex (what `SCRIPT LOAD` replies).
pub fn sha1_hex(text: &str) -> String {
    sha1_smol::Sha1::from(text.as_bytes()).digest().to_string()
}

impl Scripting {
    pub(super) fn new() -> Scripting {
        let lua = Lua::new_with(StdLib::TABLE | StdLib::STRING | StdLib::MATH, LuaOptions::new())
            .expect("Lua's safe libraries load");
        let (run, env) = prelude(&lua).expect("the prelude runs");
        lua.set_hook(HookTriggers::new().every_nth_instruction(HOOK_EVERY), |lua, _| {
            let mut run = lua.app_data_mut::<ScriptRun>().expect("a script is running");
            run.instructions += u64::from(HOOK_EVERY);
            match run.instructions > INSTRUCTION_BUDGET {
                true => Err(mlua::Error::runtime(format!("script ran past {INSTRUCTION_BUDGET} instructions"))),
                false => Ok(VmState::Continue),
            }
        })
        .expect("a hook is set");
        Scripting { lua, run, env, scripts: BTreeMap::new(), shas: BTreeMap::new() }
    }

    /// `SCRIPT LOAD`: compile `body` (once) and reply its SHA1.
    pub(super) fn load(&mut self, body: &str) -> RedisReply {
        match self.compile(body) {
            Ok((sha, _)) => RedisReply::Bulk(sha),
            Err(e) => RedisReply::Error(e),
        }
    }

    fn compile(&mut self, body: &str) -> Result<(String, Function), String> {
        if let Some(sha) = self.shas.get(body) {
            return Ok((sha.clone(), self.scripts[sha].clone()));
        }
        let sha = sha1_hex(body);
        let code = shebang(body)?;
        let f = self.lua.load(code).set_name("@user_script").into_function().map_err(|e| {
            let message = match e {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            };
            format!("ERR Error compiling script (new function): {message}")
        })?;
        f.set_environment(self.env.clone()).expect("a Lua function takes an environment");
        self.scripts.insert(sha.clone(), f.clone());
        self.shas.insert(body.to_string(), sha.clone());
        Ok((sha, f))
    }

    /// `EVAL`: compile `body` if new, then run it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn eval(
        &mut self,
        data: &mut Data,
        out: &mut Out,
        now_ms: i64,
        from: NodeIx,
        body: &str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> RedisReply {
        match self.compile(body) {
            Ok((sha, f)) => self.call(data, out, now_ms, from, &sha, f, keys, args),
            Err(e) => RedisReply::Error(e),
        }
    }

    /// `EVALSHA`: run a script loaded before, by its SHA1 (any case).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn evalsha(
        &mut self,
        data: &mut Data,
        out: &mut Out,
        now_ms: i64,
        from: NodeIx,
        sha: &str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> RedisReply {
        let sha = sha.to_ascii_lowercase();
        match self.scripts.get(&sha).cloned() {
            Some(f) => self.call(data, out, now_ms, from, &sha, f, keys, args),
            None => RedisReply::Error("NOSCRIPT No matching script. Please use EVAL.".into()),
        }
    }

    /// Run `f` with the dataset lent to the VM, and take the dataset back whatever happens.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        data: &mut Data,
        out: &mut Out,
        now_ms: i64,
        from: NodeIx,
        sha: &str,
        f: Function,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> RedisReply {
        let lent = ScriptRun { data: std::mem::take(data), out: std::mem::take(out), now_ms, from, instructions: 0 };
        self.lua.set_app_data(lent);
        let result = self.invoke(sha, f, keys, args);
        let back = self.lua.remove_app_data::<ScriptRun>().expect("the script's run is lent back");
        (*data, *out) = (back.data, back.out);
        result.unwrap_or_else(|e| RedisReply::Error(format!("ERR the model's Lua failed: {e}")))
    }

    fn invoke(&self, sha: &str, f: Function, keys: Vec<String>, args: Vec<String>) -> mlua::Result<RedisReply> {
        let (keys, args) = (self.lua.create_sequence_from(keys)?, self.lua.create_sequence_from(args)?);
        let (ok, value): (bool, Value) = self.run.call((f, keys, args))?;
        if ok {
            return Ok(reply_from_lua(&value));
        }
        // A raised error: a table {err, source, line} from the handler (luaCallFunction).
        let Value::Table(t) = value else {
            return Ok(RedisReply::Error(format!("ERR Error running script (call to f_{sha})")));
        };
        let msg: String = lossy(&t.get::<Value>("err")?).unwrap_or_default();
        let (source, line) = (lossy(&t.get::<Value>("source")?), lossy(&t.get::<Value>("line")?));
        Ok(RedisReply::Error(match (source, line) {
            (Some(source), Some(line)) => format!("{msg} script: {sha}, on {source}:{line}."),
            _ => msg,
        }))
    }
}

/// Skip a `#!lua …` first line (keeping its line feed, so line numbers stay), as Redis 7 does.
fn shebang(body: &str) -> Result<&str, String> {
    if !body.starts_with("#!") {
        return Ok(body);
    }
    let end = body.find('\n').ok_or("ERR Invalid script shebang")?;
    match body[..end].split_whitespace().next() {
        Some("#!lua") => Ok(&body[end..]),
        engine => Err(format!("ERR Unexpected engine in script shebang: {}", engine.unwrap_or(""))),
    }
}

/// Run the prelude: Redis's script environment, bound to the Rust primitives.
fn prelude(lua: &Lua) -> mlua::Result<(Function, Table)> {
    let call_raw = lua.create_function(|lua, args: MultiValue| {
        let reply = match command_line(&args) {
            Ok(argv) => {
                let mut run = lua.app_data_mut::<ScriptRun>().expect("redis.call runs inside a script");
                let run = &mut *run;
                run.data.script_call(run.now_ms, run.from, &argv, &mut run.out)
            }
            Err(e) => RedisReply::Error(e.into()),
        };
        let failed = matches!(reply, RedisReply::Error(_));
        Ok((reply_to_lua(lua, reply)?, failed))
    })?;
    let sha1 = lua.create_function(|_, v: Value| {
        let text = match &v {
            Value::String(s) => String::from_utf8_lossy(&s.as_bytes()).into_owned(),
            Value::Integer(_) | Value::Number(_) => lossy(&v).unwrap_or_default(),
            _ => String::new(),
        };
        Ok(sha1_hex(&text))
    })?;
    let rand = std::sync::Arc::new(std::sync::Mutex::new(Rand48::default()));
    let (next, seed) = (rand.clone(), rand);
    let lrand48 = lua.create_function(move |_, ()| Ok(next.lock().expect("rand48").next()))?;
    let srand48 = lua.create_function(move |_, s: i64| {
        seed.lock().expect("rand48").seed(s as i32);
        Ok(())
    })?;
    let where_ = lua.create_function(|lua, ()| {
        for level in 1.. {
            match lua.inspect_stack(level, |d| (d.source().source.map(|s| s.into_owned()), d.current_line())) {
                None => break,
                Some((Some(source), line)) if source == "@user_script" => return Ok((Some(source), line)),
                Some(_) => {}
            }
        }
        Ok((None, None))
    })?;
    let describe = lua.create_function(|_, e: Value| {
        Ok(match e {
            Value::Error(e) => rust_error(&e),
            _ => "error object is not a string".to_string(),
        })
    })?;
    lua.set_named_registry_value(CALL_RAW, call_raw.clone())?;
    // SAFETY: `redis_call` follows the Lua C API (see its comment).
    let call = unsafe { lua.create_c_function(redis_call)? };
    let chunk = lua.load(include_str!("prelude.lua")).set_name("=redis");
    chunk.call((lua.globals(), call, call_raw, sha1, lrand48, srand48, where_, describe))
}

/// The registry key of the primitive behind `redis.call` and `redis.pcall`.
const CALL_RAW: &str = "locksim.redis.call";
const CALL_RAW_C: &std::ffi::CStr = c"locksim.redis.call";

/// `redis.call`, a C function as in Redis: a Lua wrapper would be tail-called away by `return
/// redis.call(…)`, losing the script's line from the error. Calls the primitive (reply, failed) and
/// raises the reply if it is an error. Nothing on this frame needs dropping when `lua_error` unwinds.
unsafe extern "C-unwind" fn redis_call(state: *mut mlua::ffi::lua_State) -> std::ffi::c_int {
    use mlua::ffi;
    let nargs = ffi::lua_gettop(state);
    ffi::luaL_checkstack(state, 3, std::ptr::null());
    ffi::lua_getfield(state, ffi::LUA_REGISTRYINDEX, CALL_RAW_C.as_ptr());
    ffi::lua_insert(state, 1);
    ffi::lua_call(state, nargs, 2);
    let failed = ffi::lua_toboolean(state, -1) != 0;
    ffi::lua_settop(state, -2);
    if failed {
        ffi::lua_error(state);
    }
    1
}

/// A Rust error raised inside Lua (the instruction bound), as its message.
fn rust_error(e: &mlua::Error) -> String {
    match e {
        mlua::Error::RuntimeError(message) => message.clone(),
        mlua::Error::CallbackError { cause, .. } => rust_error(cause),
        other => other.to_string(),
    }
}

/// `luaArgsToRedisArgv`: strings as they are, numbers as `%.17g`, anything else an error.
fn command_line(args: &MultiValue) -> Result<Vec<String>, &'static str> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call");
    }
    args.iter()
        .map(|v| match v {
            Value::String(_) | Value::Integer(_) | Value::Number(_) => Ok(lossy(v).expect("a string or number")),
            _ => Err("ERR Lua redis lib command arguments must be strings or integers"),
        })
        .collect()
}

/// A string or number as Redis reads it from Lua (numbers as `%.17g`); `None` for other values.
fn lossy(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(String::from_utf8_lossy(&s.as_bytes()).into_owned()),
        Value::Integer(n) => Some(format_g17(*n as f64)),
        Value::Number(x) => Some(format_g17(*x)),
        _ => None,
    }
}

/// C's `printf("%.17g", x)`.
pub fn format_g17(x: f64) -> String {
    if x != 0.0 && x.fract() == 0.0 && x.abs() < 1e15 {
        return (x as i64).to_string();
    }
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a decimal exponent");
    let trim =
        |s: &str| if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s.into() };
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{x:.*}", (16 - exp) as usize))
    }
}

/// `redisProtocolToLuaType`: a reply as the script sees it.
fn reply_to_lua(lua: &Lua, reply: RedisReply) -> mlua::Result<Value> {
    let field = |name: &str, text: String| -> mlua::Result<Value> {
        let t = lua.create_table()?;
        t.set(name, text)?;
        Ok(Value::Table(t))
    };
    Ok(match reply {
        RedisReply::Ok => field("ok", "OK".into())?,
        RedisReply::Status(s) => field("ok", s)?,
        RedisReply::Error(e) => field("err", e)?,
        RedisReply::Nil => Value::Boolean(false),
        RedisReply::Int(n) => Value::Number(n as f64),
        RedisReply::Bulk(s) => Value::String(lua.create_string(s)?),
        RedisReply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, reply_to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// `luaReplyToRedisReply` (RESP2): a script's result as the client receives it.
fn reply_from_lua(value: &Value) -> RedisReply {
    match value {
        Value::String(_) => RedisReply::Bulk(lossy(value).expect("a string")),
        Value::Boolean(true) => RedisReply::Int(1),
        Value::Integer(n) => RedisReply::Int(*n),
        Value::Number(x) => RedisReply::Int(*x as i64),
        Value::Table(t) => table_reply(t),
        _ => RedisReply::Nil,
    }
}

fn table_reply(t: &Table) -> RedisReply {
    let text = |name: &str| match t.get::<Value>(name) {
        Ok(v @ Value::String(_)) => lossy(&v),
        _ => None,
    };
    if let Some(err) = text("err") {
        return RedisReply::Error(err);
    }
    if let Some(ok) = text("ok") {
        let ok = ok.replace(['\r', '\n'], " ");
        return if ok == "OK" { RedisReply::Ok } else { RedisReply::Status(ok) };
    }
    if let Ok(Value::Number(d)) = t.get::<Value>("double") {
        return RedisReply::Bulk(format_g17(d));
    }
    let mut items = Vec::new();
    for j in 1.. {
        match t.get::<Value>(j) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(reply_from_lua(&v)),
        }
    }
    RedisReply::Array(items)
}

/// Redis's `redisLrand48` (`src/rand.c`): the 48-bit linear congruential generator of `lrand48`,
/// seeded as Redis seeds it at start.
#[derive(Debug, Clone, Copy)]
struct Rand48(u64);

impl Default for Rand48 {
    fn default() -> Rand48 {
        Rand48(0x1234_ABCD_330E)
    }
}

impl Rand48 {
    const A: u64 = 0x5_DEEC_E66D;
    const MASK: u64 = (1 << 48) - 1;

    fn next(&mut self) -> i64 {
        self.0 = (self.0.wrapping_mul(Self::A).wrapping_add(0xB)) & Self::MASK;
        (self.0 >> 17) as i64
    }

    /// `redisSrand48`: the low 16 bits fixed, the seed above them.
    fn seed(&mut self, s: i32) {
        self.0 = ((u64::from(s as u32) << 16) | 0x330E) & Self::MASK;
    }
}
