-- The environment Redis 7.0 gives scripts (src/script_lua.c, src/eval.c), built once per Lua VM.
-- Called with the globals table and the Rust primitives; returns the function that runs one script.
local G, call, call_raw, sha1_raw, lrand48, srand48, where, describe = ...
local error, type, select, tostring, tonumber, setmetatable, getmetatable, rawset, xpcall =
    error, type, select, tostring, tonumber, setmetatable, getmetatable, rawset, xpcall
local floor = math.floor

-- The base library without what Redis leaves out (its deny list).
G.print, G.dofile, G.loadfile = nil, nil, nil

local redis = {}

-- redis.call raises a command's error (a table {err = ...}); redis.pcall returns it.
redis.call = call

function redis.pcall(...)
  return (call_raw(...))
end

function redis.sha1hex(...)
  if select('#', ...) ~= 1 then
    error({err = 'ERR wrong number of arguments'}, 0)
  end
  return sha1_raw((...))
end

-- luaPushErrorBuff: "-CODE msg" keeps its code, anything else gets "ERR"; \r\n trimmed.
local function error_table(text)
  local code, msg = 'ERR', text
  if text:sub(1, 1) == '-' then
    local space = text:find(' ', 1, true)
    if space then
      code, msg = text:sub(2, space - 1), text:sub(space + 1)
    else
      msg = text:sub(2)
    end
  end
  msg = msg:gsub('^[\r\n]+', ''):gsub('[\r\n]+$', '')
  return {err = code .. ' ' .. msg}
end

function redis.error_reply(...)
  local text = ...
  if select('#', ...) ~= 1 or type(text) ~= 'string' then
    return error_table('wrong number or type of arguments')
  end
  if text:sub(1, 1) ~= '-' then
    text = '-' .. text
  end
  return error_table(text)
end

function redis.status_reply(...)
  local text = ...
  if select('#', ...) ~= 1 or type(text) ~= 'string' then
    return error_table('wrong number or type of arguments')
  end
  return {ok = text}
end

-- Logging goes nowhere; replication is always by effects (Redis 7's only mode), RESP is 2.
function redis.log() end
function redis.set_repl() end
function redis.replicate_commands() return true end
function redis.setresp(v)
  if v ~= 2 then
    error({err = 'ERR the model speaks RESP2 only'}, 0)
  end
end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL = 0, 1, 2, 2, 3
redis.REDIS_VERSION, redis.REDIS_VERSION_NUM = '7.0.15', 0x07000f
G.redis = redis

-- Redis 7.0's pcall: an error table caught is handed back as its message.
local lua_pcall = G.pcall
local function pcall_result(ok, ...)
  if not ok then
    local e = ...
    if type(e) == 'table' and type(e.err) == 'string' then
      return false, e.err
    end
  end
  return ok, ...
end
G.pcall = function(...)
  return pcall_result(lua_pcall(...))
end

-- math.random is Redis's rand48 (one sequence for the server's life, as redisLrand48), never the C
-- library's: nothing random leaks into a run.
local function checkint(n, name, ...)
  local v = select(n, ...)
  local x = tonumber(v)
  if x == nil then
    local got = select('#', ...) < n and 'no value' or type(v)
    error("bad argument #" .. n .. " to '" .. name .. "' (number expected, got " .. got .. ")", 3)
  end
  return x >= 0 and floor(x) or -floor(-x)
end
local LRAND48_MAX = 2147483647
G.math.random = function(...)
  local r = (lrand48() % LRAND48_MAX) / LRAND48_MAX
  local n = select('#', ...)
  if n == 0 then
    return r
  elseif n == 1 then
    local u = checkint(1, 'random', ...)
    if u < 1 then
      error("bad argument #1 to 'random' (interval is empty)", 2)
    end
    return floor(r * u) + 1
  elseif n == 2 then
    local l, u = checkint(1, 'random', ...), checkint(2, 'random', ...)
    if l > u then
      error("bad argument #2 to 'random' (interval is empty)", 2)
    end
    return floor(r * (u - l + 1)) + l
  end
  error('wrong number of arguments', 2)
end
G.math.randomseed = function(...)
  srand48(checkint(1, 'randomseed', ...))
end

-- tostring of a table or function shows an address, which differs between runs: number them instead.
local lua_tostring = tostring
local ids, next_id = setmetatable({}, {__mode = 'k'}), 0
G.tostring = function(v)
  local t = type(v)
  if (t == 'table' or t == 'function' or t == 'userdata' or t == 'thread')
      and not (getmetatable(v) and getmetatable(v).__tostring) then
    local id = ids[v]
    if not id then
      next_id = next_id + 1
      id, ids[v] = next_id, next_id
    end
    return t .. ': 0x' .. string.format('%08x', id)
  end
  return lua_tostring(v)
end
tostring = G.tostring

-- __redis__err__handler: a message becomes {err = 'ERR ' .. message}; the script's line is added.
local function handler(err)
  if type(err) == 'userdata' then
    err = describe(err)
  end
  if type(err) ~= 'table' then
    err = {err = 'ERR ' .. tostring(err)}
  end
  local source, line = where()
  if source then
    err.source, err.line = source, line
  end
  return err
end

-- The globals are read-only for scripts, and reading one that does not exist is an error. Scripts
-- run in an environment that reads through to the globals, so a script cannot replace one either.
setmetatable(G, {
  __index = function(_, name)
    error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
  end,
  __newindex = function()
    error('Attempt to modify a readonly table', 2)
  end,
})
local env = setmetatable({}, {
  __index = G,
  __newindex = function()
    error('Attempt to modify a readonly table', 2)
  end,
})

local function run(f, keys, argv)
  rawset(G, 'KEYS', keys)
  rawset(G, 'ARGV', argv)
  return xpcall(f, handler)
end

return run, env
