//! Plain-text rendering of results, shared by the commands.

use locksim_scenarios::checkers::{fmt_span, fmt_t, Finding};
use locksim_scenarios::run::SeedResult;
use locksim_scenarios::sweep::{ScenarioResult, Summary};
use locksim_sim::history::History;

/// `text` safe inside HTML, XML and SVG, text or attribute.
pub fn escape_xml(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `text` as literal Markdown: HTML and table pipes are neutralised, emphasis and link marks escaped, so
/// a results file cannot inject markup into `report.md`.
pub fn escape_markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in escape_xml(text).chars() {
        if matches!(c, '\\' | '`' | '*' | '_' | '[' | ']' | '(' | ')' | '#' | '|' | '!') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The one command that replays a seed.
pub fn repro_line(path: &str, seed: u64) -> String {
    format!("{} repro {path} --seed {seed}", program())
}

static PROGRAM: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name the command that is running (a user's own-lock binary is not `locksim`), for the lines that
/// tell people what to type. The first name given stays.
pub fn set_program(name: &str) {
    let _ = PROGRAM.set(name.to_string());
}

/// The running command's name for lines people paste: `locksim` unless [`set_program`] said otherwise.
pub fn program() -> &'static str {
    PROGRAM.get().map_or("locksim", String::as_str)
}

/// How to see a run's example seed again: its repro line — or, for real runs, which run it was (a real
/// run does not replay; `run --real --history-dir` keeps its history).
pub fn example_line(result: &ScenarioResult) -> Option<String> {
    let seed = result.example_seed?;
    Some(match result.real {
        true => format!("real run with seed {seed} (real runs do not replay; see run --real --history-dir)"),
        false => repro_line(&result.path, seed),
    })
}

/// `1 seed`, `2 seeds`: a count and its noun, singular for one.
pub fn count(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// `81 unsafe (40.5%, 95% CI 33.9–47.4%)`: how many seeds were unsafe, as a rate with its interval.
pub fn unsafe_count(result: &ScenarioResult) -> String {
    let rate = result.unsafe_rate.interval();
    if rate.is_empty() {
        format!("{} unsafe", result.unsafe_seeds)
    } else {
        format!("{} unsafe {rate}", result.unsafe_seeds)
    }
}

/// `double-holder in 187, unsafe-write in 150`
pub fn kinds_summary(result: &ScenarioResult) -> String {
    result.seeds_with.iter().map(|(k, n)| format!("{} in {n}", k.name())).collect::<Vec<_>>().join(", ")
}

/// `seed 17 is the first, 18 seeds in; from any seed, 3 seeds (median)` — or `None` when no seed was
/// unsafe.
pub fn to_violation(result: &ScenarioResult) -> Option<String> {
    let t = result.to_violation?;
    let seeds = |n: u64| count(n, "seed", "seeds");
    let median = match t.median {
        Some(m) => format!("from any seed, {} (median)", seeds(m)),
        None => "from most seeds, none before the range ends (median unknown)".into(),
    };
    Some(format!("seed {} is the first, {} in; {median}", t.first_seed, seeds(t.first)))
}

/// `fired in 37 of 200 seeds (18.5%); 37 of 400 faults` — how many seeds' faults took effect; `None`
/// for a run without faults.
pub fn fault_coverage(result: &ScenarioResult) -> Option<String> {
    let c = result.fault_coverage?;
    let share =
        if c.seeds == 0 { String::new() } else { format!(" ({:.1}%)", 100.0 * c.seeds_fired as f64 / c.seeds as f64) };
    let seeds = if c.complete() {
        format!("in every seed ({})", c.seeds)
    } else {
        format!("in {} of {} seeds{share}", c.seeds_fired, c.seeds)
    };
    Some(format!("fired {seeds}; {} of {} faults", c.faults_fired, c.faults))
}

/// `lease-expired-while-held in 92 seeds (94 times), stale-holder-resumed in 92 seeds (92 times)`
pub fn hazards_summary(result: &ScenarioResult) -> String {
    let times = |h| result.hazard_counts.get(h).copied().unwrap_or(0);
    let each = result.seeds_with_hazard.iter().map(|(h, n)| format!("{h} in {n} seeds ({} times)", times(h)));
    each.collect::<Vec<_>>().join(", ")
}

/// `lease-expired-while-held 92, stale-holder-resumed 92`: hazards and their seeds, for one-line output.
pub fn hazards_compact(result: &ScenarioResult) -> String {
    result.seeds_with_hazard.iter().map(|(h, n)| format!("{h} {n}")).collect::<Vec<_>>().join(", ")
}

/// One line of measurements over many seeds.
pub fn summary(s: &Summary) -> String {
    let mut line = format!(
        "{} acquisitions per seed; latency p50 {} ms (median over seeds), p99 up to {} ms; {} messages per acquisition",
        s.acquisitions_per_seed, s.latency_ms_p50, s.latency_ms_p99_max, s.messages_per_acquisition
    );
    if let Some((min, median, max)) = s.recovery_ms {
        line.push_str(&format!(
            "; recovery after a holder crash {min}..{max} ms (median {median} ms, {} crashes)",
            s.recoveries
        ));
    }
    if s.unrecovered > 0 {
        line.push_str(&format!("; {} holder crashes never recovered", s.unrecovered));
    }
    line
}

pub fn finding(f: &Finding) -> String {
    let mut line = format!(
        "{} {} at {}..{} ({}): {}",
        f.kind.name(),
        f.clients.join(" & "),
        fmt_t(f.from_ns),
        fmt_t(f.to_ns),
        fmt_span(f.to_ns - f.from_ns),
        f.detail
    );
    if !f.faults.is_empty() {
        line.push_str(&format!("; faults: {}", f.faults.join("; ")));
    }
    line
}

pub fn measurements(r: &SeedResult) -> String {
    measured(&r.measurements)
}

fn measured(m: &locksim_scenarios::checkers::Measurements) -> String {
    let mut line = format!(
        "{} acquisitions; latency p50 {} ms, p99 {} ms, max {} ms; {:.1} messages per acquisition",
        m.acquisitions, m.latency_ms_p50, m.latency_ms_p99, m.latency_ms_max, m.messages_per_acquisition
    );
    if !m.recovery_ms.is_empty() || m.unrecovered > 0 {
        let shown: Vec<String> = m.recovery_ms.iter().map(|r| format!("{r} ms")).collect();
        let shown = if shown.is_empty() { "none measured".to_string() } else { shown.join(", ") };
        line.push_str(&format!("; recovery after a holder crash: {shown}"));
        if m.unrecovered > 0 {
            line.push_str(&format!(" ({} never recovered)", m.unrecovered));
        }
    }
    line
}

/// One event per line: time, node, kind, then the event's fields as `key=value`.
pub fn trace(h: &History) -> String {
    let mut out = String::new();
    for line in h.to_jsonl().lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("history lines are JSON");
        let obj = v.as_object().expect("history lines are objects");
        let t = obj["t"].as_u64().expect("t is a number");
        let fields: Vec<String> = obj
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "t" | "node" | "kind"))
            .map(|(k, v)| format!("{k}={}", v.as_str().map_or(v.to_string(), |s| s.to_string())))
            .collect();
        out.push_str(&format!(
            "{:>14.6}s  {:<16} {:<18} {}\n",
            t as f64 / 1e9,
            obj["node"].as_str().unwrap_or_default(),
            obj["kind"].as_str().unwrap_or_default(),
            fields.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_never_recovered_from_reads_as_words() {
        let m = locksim_scenarios::checkers::Measurements { unrecovered: 1, ..Default::default() };
        let line = measured(&m);
        assert!(line.ends_with("; recovery after a holder crash: none measured (1 never recovered)"), "{line}");
    }

    #[test]
    fn counts_of_one_are_singular() {
        assert_eq!(count(1, "real run", "real runs"), "1 real run");
        assert_eq!(count(2, "real run", "real runs"), "2 real runs");
    }

    #[test]
    fn markdown_and_xml_escaping_leave_no_markup() {
        let evil = "<img src=x onerror=alert(1)> | *x* [a](b) `c`";
        let md = escape_markdown(evil);
        assert!(!md.contains('<') && !md.contains("](") && !md.contains(" | "), "{md}");
        assert_eq!(escape_xml("a\"<b>&"), "a&quot;&lt;b&gt;&amp;");
    }
}
