//! A lock written outside locksim, through the public `Lock` trait, is run and judged like a built-in one.

#[allow(dead_code)]
#[path = "../examples/custom_lock.rs"]
mod custom_lock;

use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::sweep::sweep;
use locksim_scenarios::Scenario;

#[test]
fn a_users_own_lock_is_loaded_by_id_run_and_caught() {
    let scenario = Scenario::parse("my-lock.toml", custom_lock::SCENARIO, &custom_lock::registry()).unwrap();
    assert_eq!(scenario.recipe.id, "my.get-then-del");
    let result = sweep(&scenario, 0..40, 2, &|| {}).unwrap();
    assert!(!result.as_expected, "the scenario hopes for safe; pauses past the TTL make it unsafe");
    let seen = |k| result.results.iter().any(|r| r.counts.contains_key(&k));
    assert!(seen(FindingKind::DoubleHolder));
    assert!(result.results.iter().any(|r| r.measurements.acquisitions > 10), "the lock does work between faults");
}

#[test]
fn without_registering_it_the_id_is_unknown() {
    let err =
        Scenario::parse("my-lock.toml", custom_lock::SCENARIO, &locksim_locks::Registry::builtin()).err().unwrap();
    assert!(err.to_string().contains("unknown recipe id \"my.get-then-del\""), "{err}");
}

#[test]
fn a_point_the_users_recipe_declares_starts_a_fault_inside_it() {
    // A pause between the compare and the DEL, longer than the TTL: the DEL deletes the next holder's key.
    let aimed = custom_lock::SCENARIO.replace(
        "[faults.random]\nkinds = [\"pause\"]\nevery = [\"1s\", \"3s\"]\nduration = [\"1s\", \"4s\"]\n",
        "[[faults.schedule]]\nat = \"1s\"\non = \"my-compared\"\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"3s\"\n",
    );
    assert_ne!(aimed, custom_lock::SCENARIO);
    let scenario = Scenario::parse("my-lock.toml", &aimed, &custom_lock::registry()).unwrap();
    let result = sweep(&scenario, 0..20, 2, &|| {}).unwrap();
    assert_eq!(result.fault_coverage.as_ref().map(|c| c.seeds_fired), Some(20), "it fired in every seed");
    assert!(
        result.results.iter().all(|r| r.schedule[0].contains("on my-compared pause trigger")),
        "{:?}",
        result.results[0].schedule
    );
    assert!(
        result.results.iter().any(|r| r.counts.contains_key(&FindingKind::DoubleHolder)),
        "the DEL freed the next holder's key"
    );
    // Another recipe never passes it: refused at its line, naming the recipe that does.
    let builtin = aimed.replace("id = \"my.get-then-del\"", "id = \"redis.set-nx-px\"");
    let err = Scenario::parse("f.toml", &builtin, &custom_lock::registry()).err().expect("refused").to_string();
    let want = "on: \"my-compared\" is a point inside my.get-then-del, and this scenario's recipe is redis.set-nx-px";
    assert!(err.contains(want), "{err}");
    let named = Scenario::parse(
        "f.toml",
        &aimed.replace("on = \"my-compared\"", "on = \"my-comparde\""),
        &custom_lock::registry(),
    );
    assert!(
        named.err().unwrap().to_string().contains("zk-queue-create, etcd-mutex-checked, my-compared"),
        "the recipe's own point is offered"
    );
    // docs/scenarios.md shows these lines as the example has them.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/scenarios.md")).unwrap();
    let source = include_str!("../examples/custom_lock.rs");
    let block = readme.split("```rust\n").find(|b| b.contains("Point {")).expect("the README shows a point");
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    for line in
        block.split("```").next().unwrap().lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//"))
    {
        assert!(lines.contains(&line), "the README's {line:?} is not in custom_lock.rs");
    }
}
