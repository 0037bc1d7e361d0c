//! The docs cannot go stale: `docs/catalog.md` is generated from the scenario files, every `console` block
//! in README.md, ARCHITECTURE.md and docs/*.md is run against the `locksim` binary, and every relative
//! link resolves.
//!
//! A `console` block holds commands, each a line `$ locksim …`, followed by the output it must print
//! (stdout, then stderr). In the output, a line `...` matches any number of lines and `[..]` any text
//! within a line (timings, job counts); a last line `? N` expects exit code N (default 0). Commands run
//! from the repository root, so they must write under `target/`. Blocks not meant to be run use another
//! fence (`sh`, `text`).
//!
//! Regenerate the catalog page with `LOCKSIM_BLESS=1 cargo test -p <this crate> --test docs`.

use locksim_locks::Registry;
use locksim_scenarios::Scenario;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate sits in the repository").to_path_buf()
}

/// README.md, ARCHITECTURE.md and every page under docs/, sorted.
fn doc_pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

// ---------------------------------------------------------------------------------------------------
// The catalog page

/// The section a scenario is listed under, in page order, and the line that opens it: the flash sale
/// apart, the rest by family.
fn section(s: &Scenario) -> (usize, &'static str, &'static str) {
    if s.workload.stock.is_some() {
        return (
            4,
            "The flash sale",
            "Buyers decrement a stock under the lock. Every recipe sells 20 items to 5 buyers without faults \
             (`flash-sale-<recipe>`, all safe but `none`); the baselines `none` and `sql.conditional-update` are \
             the floor and the ceiling.",
        );
    }
    match s.recipe.family.name {
        "redis" => (0, "Redis", "The model: [models.md](models.md#redis)."),
        "zk" => (1, "ZooKeeper", "The model: [models.md](models.md#zookeeper)."),
        "etcd" => (2, "etcd", "The model: [models.md](models.md#etcd)."),
        "sql" => (3, "PostgreSQL", "The model: [models.md](models.md#postgresql)."),
        _ => (5, "Other", ""),
    }
}

fn faults(s: &Scenario) -> String {
    let mut parts: Vec<String> = s.schedule.iter().map(locksim_scenarios::run::describe).collect();
    if let Some(r) = &s.random {
        let kinds: Vec<&str> = r.kinds.iter().map(|k| k.name()).collect();
        let d = locksim_sim::fault::fmt_duration;
        let mut nemesis = format!(
            "nemesis: {} every {}–{} for {}–{}",
            kinds.join(", "),
            d(r.every.0),
            d(r.every.1),
            d(r.duration.0),
            d(r.duration.1)
        );
        if let Some(t) = &r.target {
            write!(nemesis, ", at {t}").unwrap();
        }
        if r.aim {
            nemesis.push_str(", aimed");
        }
        parts.push(nemesis);
    }
    if parts.is_empty() {
        return "none".into();
    }
    parts.join("; ")
}

fn expects(s: &Scenario) -> String {
    let names = |kinds: &[locksim_scenarios::checkers::FindingKind]| {
        kinds.iter().map(|k| format!("`{}`", k.name())).collect::<Vec<_>>().join(", ")
    };
    let mut out = format!("{:?}", s.expect.verdict).to_lowercase();
    if !s.expect.findings.is_empty() {
        write!(out, " ({})", names(&s.expect.findings)).unwrap();
    }
    if !s.expect.absent.is_empty() {
        write!(out, ", no {}", names(&s.expect.absent)).unwrap();
    }
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The page, from every file in scenarios/catalog/.
fn catalog_page() -> String {
    let dir = root().join("scenarios/catalog");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("scenarios/catalog/")
        .map(|e| e.expect("catalog entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let registry = Registry::builtin();
    let mut sections: BTreeMap<(usize, &str, &str), Vec<String>> = BTreeMap::new();
    for path in &files {
        let s = Scenario::load(path, &registry).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = path.file_name().expect("a file name").to_string_lossy();
        let row = format!(
            "| [`{}`](../scenarios/catalog/{file}) | `{}` | {} | {} | {} |",
            s.name,
            s.recipe.id,
            cell(&faults(&s)),
            expects(&s),
            cell(&s.description)
        );
        sections.entry(section(&s)).or_default().push(row);
    }
    let mut page = String::from(
        "# The catalog\n\n<!-- Generated from scenarios/catalog/*.toml by cli/tests/docs.rs; do not edit. Regenerate with\n     \
         LOCKSIM_BLESS=1 cargo test -p locksim-cli --test docs -->\n\n",
    );
    writeln!(
        page,
        "The {} shipped scenarios, by family, each with its recipe, its faults, the verdict it expects and what it\n\
         shows. `scenarios/suites/full.toml` runs them all in `cargo test`; `locksim list scenarios` lists them too.\n\
         The file format is in [scenarios.md](scenarios.md), the servers and clients behind them in\n\
         [models.md](models.md).\n",
        files.len()
    )
    .unwrap();
    for ((_, title, opening), rows) in &sections {
        writeln!(page, "## {title}\n").unwrap();
        if !opening.is_empty() {
            writeln!(page, "{opening}\n").unwrap();
        }
        page.push_str("| scenario | recipe | faults | expects | what it shows |\n| --- | --- | --- | --- | --- |\n");
        for row in rows {
            page.push_str(row);
            page.push('\n');
        }
        page.push('\n');
    }
    page.pop();
    page
}

#[test]
fn catalog_page_is_generated_from_the_scenario_files() {
    let path = root().join("docs/catalog.md");
    let page = catalog_page();
    if std::env::var_os("LOCKSIM_BLESS").is_some() {
        std::fs::write(&path, &page).expect("write docs/catalog.md");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "docs/catalog.md is stale: a scenario file changed. Regenerate it with\n  \
         LOCKSIM_BLESS=1 cargo test -p {} --test docs",
        env!("CARGO_PKG_NAME")
    );
}

// ---------------------------------------------------------------------------------------------------
// Console blocks

/// One `$ locksim …` line of a console block and the output it must print.
struct Example {
    at: String,
    args: Vec<String>,
    expected: Vec<String>,
    code: i32,
}

fn examples(path: &Path) -> Vec<Example> {
    let text = read(path);
    let mut out: Vec<Example> = Vec::new();
    let mut in_console = false;
    let mut in_other = false;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{}:{}", shown(path), i + 1);
        if in_console || in_other {
            if line.trim_end() == "```" {
                (in_console, in_other) = (false, false);
            } else if in_console {
                if let Some(cmd) = line.strip_prefix("$ ") {
                    assert!(!cmd.contains(['"', '\'', '\\']), "{at}: quote nothing in a checked command");
                    let mut words = cmd.split_whitespace().map(String::from);
                    assert_eq!(words.next().as_deref(), Some("locksim"), "{at}: a checked command runs locksim");
                    out.push(Example { at, args: words.collect(), expected: Vec::new(), code: 0 });
                } else {
                    let ex = out.last_mut().unwrap_or_else(|| panic!("{at}: output before any `$ locksim` line"));
                    match line.strip_prefix("? ") {
                        Some(code) => ex.code = code.trim().parse().unwrap_or_else(|_| panic!("{at}: `? N`")),
                        None => ex.expected.push(line.trim_end().to_string()),
                    }
                }
            }
        } else if let Some(fence) = line.strip_prefix("```") {
            in_console = fence.trim() == "console";
            in_other = !in_console;
        }
    }
    assert!(!(in_console || in_other), "{}: a fence is not closed", shown(path));
    out
}

/// `expected` matches `actual` where `[..]` stands for any text.
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        return expected == actual;
    };
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() || !actual.ends_with(last) {
        return false;
    }
    let mut rest = &actual[first.len()..actual.len() - last.len()];
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// `expected` matches `actual` line by line, where a line `...` stands for any number of lines.
fn lines_match(expected: &[String], actual: &[&str]) -> bool {
    // ok[i][j]: expected[i..] matches actual[j..]. Filled from the end: linear in the product, however
    // many `...` lines there are.
    let (n, m) = (expected.len(), actual.len());
    let mut ok = vec![vec![false; m + 1]; n + 1];
    ok[n][m] = true;
    for i in (0..n).rev() {
        for j in (0..=m).rev() {
            ok[i][j] = if expected[i] == "..." {
                ok[i + 1][j] || (j < m && ok[i][j + 1])
            } else {
                j < m && line_matches(&expected[i], actual[j]) && ok[i + 1][j + 1]
            };
        }
    }
    ok[0][0]
}

fn check(example: &Example) -> Result<(), String> {
    let output = Command::new(env!("CARGO_BIN_EXE_locksim"))
        .args(&example.args)
        .current_dir(root())
        .output()
        .map_err(|e| format!("{}: cannot run locksim: {e}", example.at))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let actual: Vec<&str> = stdout.lines().chain(stderr.lines()).map(str::trim_end).collect();
    let code = output.status.code().unwrap_or(-1);
    if code == example.code && lines_match(&example.expected, &actual) {
        return Ok(());
    }
    Err(format!(
        "{}: `locksim {}` exited {code} (expected {}) and printed:\n{}\n--- where the docs expect:\n{}\n",
        example.at,
        example.args.join(" "),
        example.code,
        actual.join("\n"),
        example.expected.join("\n")
    ))
}

#[test]
fn quoted_commands_print_what_the_docs_say() {
    // Commands write under target/ of the repository, which a CARGO_TARGET_DIR elsewhere leaves absent.
    std::fs::create_dir_all(root().join("target")).expect("target/");
    let all: Vec<Example> = doc_pages().iter().flat_map(|p| examples(p)).collect();
    assert!(all.len() >= 5, "the docs quote at least the README's commands");
    let failures: Vec<String> = all.iter().filter_map(|e| check(e).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} quoted commands differ:\n\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn wildcards_match_what_they_should() {
    assert!(line_matches("200 seeds in [..] s on [..] jobs", "200 seeds in 0.51 s on 2 jobs"));
    assert!(!line_matches("200 seeds in [..] s", "201 seeds in 0.51 s"));
    assert!(line_matches("a[..]", "a"));
    assert!(!line_matches("ab[..]ba", "aba"));
    let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(&lines(&["a", "...", "c"]), &["a", "b", "b", "c"]));
    assert!(lines_match(&lines(&["...", "b", "..."]), &["a", "b", "c"]));
    assert!(!lines_match(&lines(&["a", "c"]), &["a", "b", "c"]));
    assert!(!lines_match(&lines(&["...", "d"]), &["a", "b", "c"]));
}

// ---------------------------------------------------------------------------------------------------
// Links

#[test]
fn relative_links_resolve() {
    let mut broken = Vec::new();
    for page in doc_pages() {
        let text = read(&page);
        let dir = page.parent().expect("a page's directory");
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = &rest[..end];
                let file = target.split('#').next().unwrap_or("");
                if !file.is_empty() && !target.contains("://") && !dir.join(file).exists() {
                    broken.push(format!("{}:{}: {target}", shown(&page), i + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}
