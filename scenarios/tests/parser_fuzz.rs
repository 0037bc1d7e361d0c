//! The scenario parser against mangled input, as a seeded property test: catalog files cut, spliced
//! and salted with hostile tokens. Whatever comes in, the parser must not panic; every refusal must be
//! one `path:line:col: …` message; and no scenario it accepts may hold a fault that can never take
//! effect. `LOCKSIM_FUZZ_CASES` raises the number of cases for a long local run (the default keeps
//! `cargo test` quick).

mod common;

use common::catalog_dir;
use locksim_locks::Registry;
use locksim_scenarios::suite::Suite;
use locksim_scenarios::Scenario;
use locksim_sim::fault::{Action, Target};
use locksim_sim::rng::{stream, ChaCha8Rng, Rng, Stream};
use std::path::Path;

/// Pieces of TOML and values that sit at the edges of what the format allows.
const TOKENS: &[&str] = &[
    "\"",
    "=",
    "[",
    "]",
    "[[",
    "]]",
    "\n",
    ",",
    "{",
    "}",
    "-1",
    "0",
    "99999999999999999999",
    "1e309",
    "nan",
    "\"0ms\"",
    "\"999h\"",
    "\"-5s\"",
    "\"holder\"",
    "\"waiter\"",
    "\"client-99\"",
    "true",
    "[]",
    "\"pause\"",
    "\"restart\"",
    "\"partition\"",
    "\nkinds = []\n",
    "\nat = \"100h\"\n",
    "\npeers = []\n",
    "\npeers = [\"client-0\"]\n",
    "\n[faults.random]\n",
    "\n[[faults.schedule]]\n",
    "\nclients = 0\n",
    "\nduration = \"0s\"\n",
    "\nstock = 0\n",
    "\nttl = \"0ms\"\n",
    "\nname = \"../x\"\n",
    "é",
    "\t",
    "#",
    "'",
    "\\",
    "\u{0}",
    "\n[expect]\nverdict = \"maybe\"\n",
];

fn mangle(rng: &mut ChaCha8Rng, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..rng.gen_range(1..=4) {
        let at = rng.gen_range(0..=chars.len());
        match rng.gen_range(0..4) {
            0 => {
                let end = (at + rng.gen_range(1..20)).min(chars.len());
                chars.drain(at..end);
            }
            1 | 2 => {
                let token = TOKENS[rng.gen_range(0..TOKENS.len())];
                chars.splice(at..at, token.chars());
            }
            _ => {
                let end = (at + rng.gen_range(1..40)).min(chars.len());
                let copy: Vec<char> = chars[at..end].to_vec();
                let to = rng.gen_range(0..=chars.len());
                chars.splice(to..to, copy);
            }
        }
    }
    chars.into_iter().collect()
}

/// `path:line:col: message`, with a message.
fn is_positioned(error: &str, path: &str) -> bool {
    let Some(rest) = error.strip_prefix(&format!("{path}:")) else { return false };
    let mut parts = rest.splitn(3, ':');
    let number = |p: Option<&str>| p.is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    number(parts.next()) && number(parts.next()) && parts.next().is_some_and(|m| m.len() > 1)
}

/// What no accepted scenario may hold: a fault that can never take effect.
fn faults_can_fire(s: &Scenario) -> Result<(), String> {
    for f in &s.schedule {
        if f.at >= s.workload.duration {
            return Err(format!("a fault at {:?} in a run of {:?}", f.at, s.workload.duration));
        }
        if let (Action::Partition { peers, .. } | Action::Clog { peers, .. }, Target::Node(n)) = (&f.action, &f.target)
        {
            if !peers.is_empty() && peers.iter().all(|p| p == n) {
                return Err(format!("a cut of {n} from itself"));
            }
        }
    }
    match &s.random {
        Some(r) if r.kinds.is_empty() => Err("a nemesis with no kinds".into()),
        _ => Ok(()),
    }
}

#[test]
fn mangled_scenarios_never_panic_and_are_refused_with_a_position_or_can_fire() {
    let cases: u64 = std::env::var("LOCKSIM_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(3000);
    let mut files: Vec<(String, String)> = std::fs::read_dir(catalog_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    files.sort();
    let registry = Registry::builtin();
    let mut rng = stream(20_261_123, Stream::Workload, 0);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..cases {
        let (name, text) = &files[rng.gen_range(0..files.len())];
        let input = mangle(&mut rng, text);
        let path = format!("case-{case}-{name}");
        let parsed = std::panic::catch_unwind(|| Scenario::parse(&path, &input, &registry));
        let parsed = parsed.unwrap_or_else(|_| panic!("the parser panicked on case {case}:\n{input}"));
        match parsed {
            Ok(scenario) => {
                faults_can_fire(&scenario).unwrap_or_else(|why| panic!("case {case} accepted {why}:\n{input}"));
                accepted += 1;
            }
            Err(e) => {
                let e = e.to_string();
                assert!(is_positioned(&e, &path), "case {case}: {e:?} names no position:\n{input}");
                assert_eq!(e.lines().count(), 1, "case {case}: one line: {e:?}");
                refused += 1;
            }
        }
    }
    assert!(accepted > 0 && refused > 0, "the cases exercise both ways: {accepted} accepted, {refused} refused");
}

/// Suite-file pieces at the edges of what the format allows.
const SUITE_TOKENS: &[&str] = &[
    "\n[[run]]\n",
    "\nseeds = \"5..1\"\n",
    "\nseeds = \"18446744073709551615\"\n",
    "\nseeds = \"0..18446744073709551616\"\n",
    "\nclients = 0\n",
    "\nclients = 1001\n",
    "\nclients = 1\n",
    "\nscenario = \"nowhere.toml\"\n",
    "\nscenario = \"\"\n",
    "\n[run.expect]\nverdict = \"unsafe\"\n",
    "\n[run.expect]\nfindings = [\"nope\"]\n",
    "\nname = 7\n",
];

#[test]
fn mangled_suites_never_panic_and_are_refused_with_a_position() {
    let cases: u64 = std::env::var("LOCKSIM_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).map_or(300, |n: u64| n / 10);
    let suites = Path::new(env!("CARGO_MANIFEST_DIR")).join("suites");
    let catalog = catalog_dir().display().to_string();
    // Absolute scenario paths, so the mangled suite can live in a scratch directory.
    let text = std::fs::read_to_string(suites.join("smoke.toml")).unwrap().replace("../catalog", &catalog);
    let dir = std::env::temp_dir().join(format!("locksim-suite-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let registry = Registry::builtin();
    let mut rng = stream(20_261_124, Stream::Workload, 0);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..cases {
        // Whole lines at line starts (mostly valid TOML, so the checks behind the parser run), or a
        // mangling as for scenarios.
        let input = if rng.gen_bool(0.6) {
            let starts: Vec<usize> = text.match_indices('\n').map(|(i, _)| i + 1).collect();
            let at = starts[rng.gen_range(0..starts.len())];
            let token = SUITE_TOKENS[rng.gen_range(0..SUITE_TOKENS.len())];
            format!("{}{}{}", &text[..at], token.trim_start_matches('\n'), &text[at..])
        } else {
            mangle(&mut rng, &text)
        };
        let path = dir.join(format!("case-{case}.toml"));
        std::fs::write(&path, &input).unwrap();
        let loaded = std::panic::catch_unwind(|| Suite::load(&path, &registry));
        let loaded = loaded.unwrap_or_else(|_| panic!("the suite parser panicked on case {case}:\n{input}"));
        match loaded {
            Ok(suite) => {
                for run in &suite.runs {
                    faults_can_fire(&run.scenario).unwrap_or_else(|why| panic!("case {case} accepted {why}"));
                    assert!(!run.seeds.is_empty(), "case {case}: an empty seed range accepted");
                }
                accepted += 1;
            }
            Err(e) => {
                let e = e.to_string();
                // The suite, or a scenario it names (a mangled path may name another catalog file).
                let at = |p: &str| is_positioned(&e, p);
                let shown = path.display().to_string();
                let positioned =
                    at(&shown) || e.split(':').next().is_some_and(|file| file.starts_with(&catalog) && at(file));
                assert!(positioned, "case {case}: {e:?} names no position:\n{input}");
                assert_eq!(e.lines().count(), 1, "case {case}: one line: {e:?}");
                refused += 1;
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    let _ = std::fs::remove_dir(&dir);
    assert!(accepted > 0 && refused > 0, "the cases exercise both ways: {accepted} accepted, {refused} refused");
}
