//! `[recipe] command = [...]`: a lock in any language, which the parser accepts (with its keys as
//! strings for the process) and which runs only in real mode.

use locksim_locks::Registry;
use locksim_locks::{etcd, redis, sql, zk};
use locksim_scenarios::Scenario;

fn parse(recipe: &str) -> Result<Scenario, String> {
    let text = format!(
        "name = \"c\"\n[recipe]\n{recipe}\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \"3s\"\n\
                [check]\ndeadlock = false\n"
    );
    Scenario::parse("c.toml", &text, &Registry::builtin()).map_err(|e| e.to_string())
}

#[test]
fn a_command_recipe_keeps_its_argv_and_its_keys_as_strings() {
    let s =
        parse("command = [\"python3\", \"lock.py\"]\ntimeout = \"1s\"\nretries = 3\nfair = true\nratio = 0.5").unwrap();
    let c = s.command.expect("a command recipe");
    assert_eq!(c.argv, ["python3", "lock.py"]);
    let params: Vec<(&str, &str)> = c.params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(params, [("fair", "true"), ("ratio", "0.5"), ("retries", "3"), ("timeout", "1s")]);
    assert_eq!(s.recipe.id, locksim_locks::command::ID);
    assert_eq!(c.server, &redis::REAL, "Redis unless the file says otherwise");
    let zk = parse("command = [\"a\"]\nserver = \"zookeeper\"\nsession_timeout = \"2s\"").unwrap().command.unwrap();
    assert_eq!((zk.server, zk.params.len()), (&zk::REAL, 1), "`server` is not passed as a parameter");
    for (name, server, node, env) in
        [("etcd", &etcd::REAL, "etcd-0", "LOCKSIM_ETCD"), ("postgresql", &sql::REAL, "db-0", "LOCKSIM_POSTGRES")]
    {
        let c = parse(&format!("command = [\"a\"]\nserver = \"{name}\"")).unwrap().command.unwrap();
        assert_eq!((c.server, c.server.node, c.server.env), (server, node, env), "{name}");
    }
}

/// `request_timeout` is locksim's (each request's deadline in real mode), not a parameter for the process.
#[test]
fn a_command_recipe_may_set_its_request_timeout() {
    let c = parse("command = [\"a\"]\nrequest_timeout = \"90s\"\ntimeout = \"1s\"").unwrap().command.unwrap();
    assert_eq!(c.request_timeout, Some(std::time::Duration::from_secs(90)));
    assert_eq!(c.params.keys().collect::<Vec<_>>(), ["timeout"], "not passed as LOCKSIM_PARAM_REQUEST_TIMEOUT");
    assert_eq!(parse("command = [\"a\"]").unwrap().command.unwrap().request_timeout, None, "real mode's default");
}

/// `[expect] real_runs`: how many real runs it takes to see the verdict.
#[test]
fn a_scenario_may_say_how_many_real_runs_it_needs() {
    let with = |expect: &str| {
        let text = format!(
            "name = \"c\"\n[recipe]\ncommand = [\"a\"]\n[workload]\nkind = \"counter\"\nclients = 2\n\
             duration = \"3s\"\n[expect]\nverdict = \"unsafe\"\n{expect}[check]\ndeadlock = false\n"
        );
        Scenario::parse("c.toml", &text, &Registry::builtin()).map_err(|e| e.to_string())
    };
    assert_eq!(with("real_runs = 3\n").unwrap().real_runs, Some(3));
    assert_eq!(with("").unwrap().real_runs, None);
    for bad in ["0", "-1", "10001"] {
        let e = with(&format!("real_runs = {bad}\n")).err().unwrap();
        assert!(e.starts_with("c.toml:10:13: real_runs: expected a whole number from 1 to 10000"), "{bad}: {e}");
    }
    let e = with("real_runs = \"3\"\n").err().unwrap();
    assert!(e.starts_with("c.toml:10:13: "), "{e}");
}

#[test]
fn a_command_recipe_may_have_readers() {
    let text = "name = \"c\"\n[recipe]\ncommand = [\"a\"]\n[workload]\nkind = \"counter\"\nclients = 2\n\
                duration = \"3s\"\nreads = 0.5\n[check]\nliveness = \"1s\"\n";
    let s = Scenario::parse("c.toml", text, &Registry::builtin()).unwrap();
    assert_eq!(s.workload.reads, 0.5, "the adapter answers a shared acquisition (or fails it)");
}

#[test]
fn a_recipe_by_id_has_no_command() {
    assert!(parse("id = \"redis.set-nx-px\"").unwrap().command.is_none());
}

#[test]
fn bad_command_recipes_are_refused_at_their_line() {
    for (recipe, said) in [
        ("command = []", "c.toml:3:11: command: expected a non-empty array of strings"),
        ("command = [\"a\", 1]", "c.toml:3:11: command: expected a non-empty array of strings"),
        ("command = \"lock.py\"", "c.toml:3:11: command: expected a non-empty array of strings"),
        ("command = [\"a\"]\nid = \"redis.set-nx\"", "c.toml:4:6: [recipe] has `command`, so no `id`"),
        ("id = \"command\"", "c.toml:3:6: id: the command recipe is written `command = [\"program\", \"arg\"]`"),
        ("command = [\"a\"]\nTimeOut = \"1s\"", "c.toml:4:1: \"TimeOut\": a command's parameter names are lower-case"),
        ("command = [\"a\"]\nt = [1]", "c.toml:4:5: t: a command's parameter is a string, number or boolean"),
        ("command = [\"a\"]\nrequest_timeout = \"0s\"", "c.toml:4:19: request_timeout: expected a duration above zero"),
        ("command = [\"a\"]\nrequest_timeout = 30", "c.toml:4:19: request_timeout: expected a string"),
        ("command = [\"a\"]\nrequest_timeout = \"soon\"", "c.toml:4:19: request_timeout: "),
        (
            "command = [\"a\"]\nserver = \"mysql\"",
            "c.toml:4:1: server: expected one of redis, zookeeper, etcd, postgresql",
        ),
    ] {
        let e = parse(recipe).err().unwrap_or_else(|| panic!("{recipe} parsed"));
        assert!(e.starts_with(said), "{recipe}: {e}");
    }
}

#[test]
fn a_suite_refuses_a_command_scenario() {
    let dir = std::env::temp_dir().join(format!("locksim-command-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario =
        "name = \"c\"\n[recipe]\ncommand = [\"a\"]\n[workload]\nkind = \"counter\"\nclients = 1\nduration = \"1s\"\n\
         [check]\ndeadlock = false\n";
    std::fs::write(dir.join("c.toml"), scenario).unwrap();
    std::fs::write(dir.join("s.toml"), "[[run]]\nscenario = \"c.toml\"\nseeds = \"0..2\"\n").unwrap();
    let loaded = locksim_scenarios::suite::Suite::load(&dir.join("s.toml"), &Registry::builtin());
    std::fs::remove_dir_all(&dir).unwrap();
    let e = loaded.err().unwrap();
    assert!(e.to_string().contains("recipe `command` runs only with --real"), "{e}");
}

#[test]
fn a_command_with_a_model_simulates_the_model_and_runs_the_command_for_real() {
    let s = parse("command = [\"a\"]\ntimeout = \"1s\"\n[model]\nid = \"redis.set-nx-px\"\nttl = \"1s\"").unwrap();
    assert_eq!(s.recipe.id, "redis.set-nx-px");
    assert_eq!(s.recipe_params.duration("ttl"), std::time::Duration::from_secs(1));
    assert!(!s.only_real(), "a simulated run runs the model");
    let c = s.command.expect("the command stays, for --real");
    assert_eq!((c.label().as_str(), c.params.len()), ("command a", 1));
    assert!(parse("command = [\"a\"]").unwrap().only_real());
    let zk = parse("command = [\"a\"]\nserver = \"zookeeper\"\n[model]\nid = \"zk.sequential\"").unwrap();
    assert_eq!(zk.recipe.id, "zk.sequential");
}

#[test]
fn a_model_that_cannot_stand_for_the_command_is_refused_at_its_line() {
    for (recipe, said) in [
        ("command = [\"a\"]\n[model]\nttl = \"1s\"", "c.toml:4:1: [model] needs `id` (see `locksim list recipes`)"),
        (
            "command = [\"a\"]\n[model]\nid = \"zk.sequential\"",
            "c.toml:4:1: [model]: zk.sequential is a zk recipe, but the command's server is redis: the model must be a \
             redis recipe",
        ),
        ("command = [\"a\"]\n[model]\nid = \"redis.set-nx-px\"\nttl = 5", "c.toml:6:7: ttl: expected a string"),
        ("command = [\"a\"]\n[model]\nid = \"redis.set-nx-px\"\nretries = 5", "c.toml:6:1: unknown key `retries` in [model] of redis.set-nx-px"),
        ("id = \"redis.set-nx-px\"\n[model]\nid = \"redis.set-nx-px\"", "c.toml:4:1: [model] is the simulator's model"),
    ] {
        let e = parse(recipe).err().unwrap_or_else(|| panic!("{recipe} parsed"));
        assert!(e.starts_with(said), "{recipe}: {e}");
    }
}

#[test]
fn a_model_whose_world_has_other_servers_than_the_real_run_is_refused() {
    let e = parse("command = [\"a\"]\n[model]\nid = \"redis.set-nx-px\"\n[backend]\nreplicas = 1").err().unwrap();
    assert!(
        e.starts_with(
            "c.toml:4:1: [model]: its world has the servers redis-0, redis-0-replica, but a real run has one, redis-0"
        ),
        "{e}"
    );
}
