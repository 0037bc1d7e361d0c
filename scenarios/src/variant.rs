//! What makes a scenario's lock a variant of its recipe: the settings a team would choose differently
//! — recipe and backend parameters away from their defaults, fencing, shared reads — so that results of
//! a broken variant and its fix are never added up together (`release=del` beside compare-and-delete,
//! fenced beside unfenced).
//!
//! Client counts, hold times and faults are left out: they describe the test, not the lock.

use crate::scenario::Scenario;
use locksim_locks::params::{ParamSpec, ParamValue, Params};
use locksim_sim::fault::fmt_duration;

/// `release=del, ttl=5s, fencing`; empty for the recipe as it ships.
pub fn label(s: &Scenario) -> String {
    let mut parts = changed(s.recipe.params, &s.recipe_params);
    parts.extend(changed(s.recipe.family.params, &s.backend_params));
    if s.workload.reads > 0.0 {
        parts.push(format!("reads={}", s.workload.reads));
    }
    if s.workload.fencing {
        parts.push("fencing".into());
    }
    parts.join(", ")
}

/// `name=value` for each parameter of `specs` whose value in `values` is not its default, in name order.
fn changed(specs: &[ParamSpec], values: &Params) -> Vec<String> {
    values
        .iter()
        .filter_map(|(name, value)| {
            let spec = specs.iter().find(|s| s.name == name)?;
            (spec.default != *value).then(|| format!("{name}={}", show(value)))
        })
        .collect()
}

/// A value as a label shows it: like the scenario file, without quotes.
fn show(value: &ParamValue) -> String {
    match value {
        ParamValue::Duration(d) => fmt_duration(*d),
        ParamValue::Choice(c) => c.to_string(),
        other => ParamSpec::show(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locksim_locks::Registry;

    fn scenario(recipe: &str, workload: &str) -> Scenario {
        let text = format!(
            "name = \"v\"\n[recipe]\n{recipe}\n[workload]\nkind = \"counter\"\nclients = 3\nduration = \"60s\"\n{workload}"
        );
        Scenario::parse("v.toml", &text, &Registry::builtin()).expect("a valid scenario")
    }

    #[test]
    fn the_recipe_as_it_ships_has_no_label() {
        assert_eq!(label(&scenario("id = \"redis.set-nx-px\"", "")), "");
        // Writing a default out does not make a variant.
        assert_eq!(label(&scenario("id = \"redis.set-nx-px\"\nrelease = \"compare-and-delete\"", "")), "");
    }

    #[test]
    fn changed_parameters_and_fencing_name_the_variant() {
        let s = scenario("id = \"redis.set-nx-px\"\nrelease = \"del\"\nttl = \"5s\"", "fencing = true");
        assert_eq!(label(&s), "release=del, ttl=5s, fencing");
        let s = scenario("id = \"etcd.mutex\"\nrecheck = false", "");
        assert_eq!(label(&s), "recheck=false");
    }

    #[test]
    fn backend_parameters_and_shared_reads_count_too() {
        let s = scenario("id = \"redis.set-nx-px\"\n[backend]\nreplicas = 1", "");
        assert_eq!(label(&s), "replicas=1");
        let s = scenario("id = \"zk.rwlock\"", "reads = 0.5");
        assert_eq!(label(&s), "reads=0.5");
    }
}
