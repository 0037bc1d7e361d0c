//! The Lua scripts lock libraries send, quoted as they send them (the text is what is hashed for
//! `EVALSHA`, so even its whitespace is theirs).

/// redis-py `Lock.LUA_RELEASE_SCRIPT` (redis-py 5.x `redis/lock.py`): delete the lock only if it holds
/// our token. Sent by `EVALSHA`, loaded on `NOSCRIPT` (redis-py's `Script`).
pub const REDIS_PY_RELEASE: &str = "
        local token = redis.call('get', KEYS[1])
        if not token or token ~= ARGV[1] then
            return 0
        end
        redis.call('del', KEYS[1])
        return 1
    ";

/// The unlock script of "Distributed Locks with Redis" (redis.io), which the Redlock clients send.
pub const REDLOCK_UNLOCK: &str = r#"if redis.call("get",KEYS[1]) == ARGV[1] then
    return redis.call("del",KEYS[1])
else
    return 0
end"#;

/// redsync v4's `deleteScript` (go-redsync/redsync `mutex.go`).
pub const REDSYNC_DELETE: &str = r#"
	if redis.call("GET", KEYS[1]) == ARGV[1] then
		return redis.call("DEL", KEYS[1])
	else
		return 0
	end
"#;

/// redsync v4's `touchScript`: extend the lock's TTL only if it holds our value.
pub const REDSYNC_TOUCH: &str = r#"
	if redis.call("GET", KEYS[1]) == ARGV[1] then
		return redis.call("PEXPIRE", KEYS[1], ARGV[2])
	else
		return 0
	end
"#;

/// Redisson `RedissonLock.tryLockInnerAsync` (3.x): the lock is a hash `{<instance id>:<thread id> →
/// hold count}`. Free or ours: count one more, set the TTL, reply nil. Another's: reply its PTTL.
/// KEYS: the lock. ARGV: the lease (ms), our lock name.
pub const REDISSON_LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// Redisson `RedissonLock.unlockInnerAsync` (3.45): count one less; at zero delete the lock and
/// publish the unlock message. The latch key (`redisson_unlock_latch:{lock}:<request id>`) keeps the
/// answer for a retried unlock. Replies 1 (unlocked), 0 (still held), nil (not ours).
/// KEYS: the lock, its channel, the latch. ARGV: the unlock message, the lease (ms), our lock name,
/// the publish command, the latch's TTL (ms).
pub const REDISSON_UNLOCK: &str = "local val = redis.call('get', KEYS[3]); if val ~= false then return tonumber(val);end; if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil;end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; else redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1; end; ";

/// Redisson 3.44+ `renewal/LockTask.renew`: renew each lock still ours; replies a 1 or 0 per lock.
/// KEYS: the locks. ARGV: the lease (ms), then our lock name for each.
pub const REDISSON_RENEW: &str = "local result = {} for i = 1, #KEYS, 1 do if (redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1) then redis.call('pexpire', KEYS[i], ARGV[1]); table.insert(result, 1); else table.insert(result, 0); end; end; return result;";

/// Redisson up to 3.43 `RedissonBaseLock.renewExpirationAsync`: 1 if renewed, 0 if not ours.
/// KEYS: the lock. ARGV: the lease (ms), our lock name.
pub const REDISSON_RENEW_3_43: &str = "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('pexpire', KEYS[1], ARGV[1]); return 1; end; return 0;";

/// Redisson's channel for a lock's unlock messages (`prefixName("redisson_lock__channel", name)`).
pub fn redisson_channel(lock: &str) -> String {
    format!("redisson_lock__channel:{{{lock}}}")
}

/// Redisson's unlock latch for one unlock request (`getUnlockLatchName`).
pub fn redisson_unlock_latch(lock: &str, request_id: &str) -> String {
    format!("redisson_unlock_latch:{{{lock}}}:{request_id}")
}

/// Redisson's `LockPubSub.UNLOCK_MESSAGE`.
pub const REDISSON_UNLOCK_MESSAGE: &str = "0";

#[cfg(test)]
mod tests {
    use super::*;
    use locksim_sim::backend::redis::RedisReply::{self, *};
    use locksim_sim::backend::redis::{PubSubMessage, RedisRequest, RedisState};
    use locksim_sim::backend::{Backend, Now, Out};
    use locksim_sim::history::NodeIx;

    const A: &str = "8743c9c0-0795-4907-87fd-6c719a6b4586:1";
    const B: &str = "1f0b2c5e-6a7d-4e1b-9c3f-2d8e4a5b6c7d:1";
    const LOCK: &str = "lock";

    /// EVAL `script` at `now_ms` from node 0, with what the server pushed.
    fn eval(s: &mut RedisState, now_ms: i64, script: &str, keys: &[&str], args: &[&str]) -> (RedisReply, Out) {
        let owned = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        let request = RedisRequest::Eval { script: script.into(), keys: owned(keys), args: owned(args) };
        let mut out = Out::default();
        (s.apply(Now::at(now_ms), NodeIx(0), request, &mut out), out)
    }

    fn run(s: &mut RedisState, now_ms: i64, args: &[&str]) -> RedisReply {
        let request = RedisRequest::Command { args: args.iter().map(|x| x.to_string()).collect() };
        s.apply(Now::at(now_ms), NodeIx(0), request, &mut Out::default())
    }

    fn lock(s: &mut RedisState, now_ms: i64, owner: &str) -> RedisReply {
        eval(s, now_ms, REDISSON_LOCK, &[LOCK], &["30000", owner]).0
    }

    fn unlock(s: &mut RedisState, now_ms: i64, owner: &str, request: &str) -> (RedisReply, Out) {
        let (channel, latch) = (redisson_channel(LOCK), redisson_unlock_latch(LOCK, request));
        let keys = [LOCK, channel.as_str(), latch.as_str()];
        eval(s, now_ms, REDISSON_UNLOCK, &keys, &[REDISSON_UNLOCK_MESSAGE, "30000", owner, "publish", "13500"])
    }

    #[test]
    fn redissons_lock_and_unlock_scripts_run_unchanged() {
        let mut s = RedisState::default();
        assert_eq!(lock(&mut s, 0, A), Nil, "free: taken");
        assert_eq!(run(&mut s, 0, &["HGET", LOCK, A]), Bulk("1".into()));
        assert_eq!(lock(&mut s, 1_000, A), Nil, "ours: taken again (re-entrant)");
        assert_eq!(run(&mut s, 1_000, &["HGET", LOCK, A]), Bulk("2".into()));
        assert_eq!(run(&mut s, 1_000, &["PTTL", LOCK]), Int(30_000), "the TTL set again");
        assert_eq!(lock(&mut s, 4_000, B), Int(27_000), "another's: refused with the lock's PTTL");
        // A waiter's subscription hears the unlock.
        let channel = redisson_channel(LOCK);
        s.apply(Now::at(4_000), NodeIx(7), RedisRequest::Subscribe { channel: channel.clone() }, &mut Out::default());
        let (reply, out) = unlock(&mut s, 5_000, A, "r1");
        assert_eq!(reply, Int(0), "one hold left");
        assert!(out.pushes.is_empty(), "no unlock message while still held");
        assert_eq!(unlock(&mut s, 5_000, B, "r2").0, Nil, "not B's to unlock");
        let (reply, mut out) = unlock(&mut s, 6_000, A, "r3");
        assert_eq!(reply, Int(1), "unlocked");
        let (to, message) = out.pushes.pop().expect("the unlock message");
        assert_eq!(to, NodeIx(7));
        assert_eq!(*message.downcast::<PubSubMessage>().unwrap(), PubSubMessage { channel, message: "0".into() });
        assert_eq!(run(&mut s, 6_000, &["EXISTS", LOCK]), Int(0));
        assert_eq!(unlock(&mut s, 7_000, A, "r3").0, Int(1), "a retried unlock gets its first answer (the latch)");
        assert_eq!(lock(&mut s, 7_000, B), Nil, "free again");
    }

    #[test]
    fn redissons_renewals_renew_only_their_own_lock() {
        let mut s = RedisState::default();
        assert_eq!(lock(&mut s, 0, A), Nil);
        assert_eq!(eval(&mut s, 10_000, REDISSON_RENEW, &[LOCK], &["30000", A]).0, Array(vec![Int(1)]));
        assert_eq!(run(&mut s, 10_000, &["PTTL", LOCK]), Int(30_000));
        assert_eq!(eval(&mut s, 10_000, REDISSON_RENEW, &[LOCK], &["30000", B]).0, Array(vec![Int(0)]));
        assert_eq!(eval(&mut s, 20_000, REDISSON_RENEW_3_43, &[LOCK], &["30000", A]).0, Int(1));
        assert_eq!(run(&mut s, 20_000, &["PTTL", LOCK]), Int(30_000));
        assert_eq!(eval(&mut s, 20_000, REDISSON_RENEW_3_43, &[LOCK], &["30000", B]).0, Int(0));
        assert_eq!(eval(&mut s, 50_000, REDISSON_RENEW_3_43, &[LOCK], &["30000", A]).0, Int(0), "expired");
    }

    #[test]
    fn redsync_and_redis_py_scripts_run_unchanged() {
        let mut s = RedisState::default();
        assert_eq!(run(&mut s, 0, &["SET", LOCK, "mine", "NX", "PX", "8000"]), Ok);
        assert_eq!(eval(&mut s, 1_000, REDSYNC_TOUCH, &[LOCK], &["theirs", "8000"]).0, Int(0));
        assert_eq!(eval(&mut s, 1_000, REDSYNC_TOUCH, &[LOCK], &["mine", "8000"]).0, Int(1));
        assert_eq!(run(&mut s, 1_000, &["PTTL", LOCK]), Int(8_000));
        assert_eq!(eval(&mut s, 2_000, REDSYNC_DELETE, &[LOCK], &["theirs"]).0, Int(0));
        assert_eq!(eval(&mut s, 2_000, REDSYNC_DELETE, &[LOCK], &["mine"]).0, Int(1));
        assert_eq!(eval(&mut s, 2_000, REDSYNC_DELETE, &[LOCK], &["mine"]).0, Int(0), "gone");
        for release in [REDIS_PY_RELEASE, REDLOCK_UNLOCK] {
            assert_eq!(run(&mut s, 3_000, &["SET", LOCK, "mine"]), Ok);
            assert_eq!(eval(&mut s, 3_000, release, &[LOCK], &["theirs"]).0, Int(0));
            assert_eq!(eval(&mut s, 3_000, release, &[LOCK], &["mine"]).0, Int(1));
            assert_eq!(eval(&mut s, 3_000, release, &[LOCK], &["mine"]).0, Int(0));
        }
    }
}
