//! Determinism rules, checked: nothing in the simulated code may read the machine's clock, draw
//! unseeded randomness or iterate a `HashMap` (its order differs between processes and threads), nor
//! let tokio's thread-local random numbers order tasks (an unbiased `select!`, `sync::watch`).

use std::path::Path;

const BANNED: &[(&str, &str)] = &[
    ("HashMap", "iteration order differs between runs: use BTreeMap"),
    ("HashSet", "iteration order differs between runs: use BTreeSet"),
    ("Instant::now", "wall-clock time must not reach a history: use the node's Clock"),
    ("SystemTime", "wall-clock time must not reach a history: use the node's Clock"),
    ("thread_rng", "unseeded: draw from locksim_sim::rng streams"),
    ("sync::watch", "tokio's watch wakes its waiters in a random order: use locksim_sim::signal"),
    ("watch::channel", "tokio's watch wakes its waiters in a random order: use locksim_sim::signal"),
    ("dbg!", "debugging left in"),
];

fn check_dir(dir: &Path, problems: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            check_dir(&path, problems);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (n, line) in lines.iter().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                // An unbiased `select!` picks its first branch with tokio's thread-local random number.
                if code.contains("select! {") && lines.get(n + 1).map(|l| l.trim()) != Some("biased;") {
                    problems.push(format!(
                        "{}:{}: select! without `biased;`: tokio draws the order",
                        path.display(),
                        n + 1
                    ));
                }
                for (word, why) in BANNED {
                    if code.contains(word) {
                        problems.push(format!("{}:{}: {word}: {why}", path.display(), n + 1));
                    }
                }
            }
        }
    }
}

#[test]
fn simulated_code_uses_no_wall_clock_unseeded_randomness_or_hash_order() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut problems = Vec::new();
    for krate in ["sim/src", "locks/src", "scenarios/src", "scenarios/examples"] {
        check_dir(&root.join(krate), &mut problems);
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}
