//! JUnit XML, the test report format CI systems render: one test case per suite run, failed when its
//! verdict differs from the expectation, with the reasons and the repro command as the message.

use crate::text::{escape_xml as escape, example_line};
use locksim_scenarios::reason;
use locksim_scenarios::sweep::ScenarioResult;

/// The report for `runs` of suite `name`; `seconds[i]` is how long run `i` took.
pub fn junit(name: &str, runs: &[ScenarioResult], seconds: &[f64]) -> String {
    let failures = runs.iter().filter(|r| !r.as_expected).count();
    let total: f64 = seconds.iter().sum();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml.push_str(&format!(
        "<testsuites name=\"locksim\" tests=\"{}\" failures=\"{failures}\" time=\"{total:.3}\">\n",
        runs.len()
    ));
    xml.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{total:.3}\">\n",
        escape(name),
        runs.len()
    ));
    for (run, time) in runs.iter().zip(seconds) {
        let label = format!("{} (seeds {}..{})", run.scenario, run.seeds.start, run.seeds.end);
        xml.push_str(&format!(
            "    <testcase classname=\"locksim.{}\" name=\"{}\" time=\"{time:.3}\"",
            escape(&run.recipe),
            escape(&label)
        ));
        if run.as_expected {
            xml.push_str("/>\n");
            continue;
        }
        let mut body = reason::join(&run.reasons, "\n");
        if let Some(line) = example_line(run) {
            body.push_str(&format!("\nreproduce: {line}"));
        }
        xml.push_str(&format!(
            ">\n      <failure message=\"{}\" type=\"verdict\">{}</failure>\n    </testcase>\n",
            escape(&reason::join(&run.reasons, "; ")),
            escape(&body)
        ));
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}
