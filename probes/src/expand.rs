//! `$(VAR)` expansion of an exec probe's command with the container's static
//! environment, as kubelet does (`ExpandContainerCommandOnlyStatic`): every
//! `env` entry counts with its literal `value` (an entry set through
//! `valueFrom` expands to the empty string), `$$` is an escaped `$`, and a
//! reference to an unknown variable is left as written.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::EnvVar;
use keelson_common::expansion::expand_known;

/// Expands every element of `command` against `env`.
pub fn expand_command(command: &[String], env: &[EnvVar]) -> Vec<String> {
    let mut vars: HashMap<&str, &str> = HashMap::with_capacity(env.len());
    for var in env {
        vars.insert(var.name.as_str(), var.value.as_deref().unwrap_or(""));
    }
    command
        .iter()
        .map(|arg| expand_known(arg, |n| vars.get(n).map(|v| (*v).to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, Option<&str>)]) -> Vec<EnvVar> {
        pairs
            .iter()
            .map(|(n, v)| EnvVar {
                name: n.to_string(),
                value: v.map(str::to_string),
                ..EnvVar::default()
            })
            .collect()
    }

    fn one(arg: &str, vars: &[EnvVar]) -> String {
        expand_command(&[arg.to_string()], vars).remove(0)
    }

    #[test]
    fn expands_known_variables_and_keeps_unknown_ones() {
        let vars = env(&[("PORT", Some("8080")), ("FROM_SECRET", None)]);
        assert_eq!(
            one("curl localhost:$(PORT)/x", &vars),
            "curl localhost:8080/x"
        );
        assert_eq!(one("$(MISSING)", &vars), "$(MISSING)");
        assert_eq!(one("[$(FROM_SECRET)]", &vars), "[]");
    }

    #[test]
    fn escapes_and_incomplete_references_stay_literal() {
        let vars = env(&[("A", Some("x"))]);
        assert_eq!(one("$$(A)", &vars), "$(A)");
        assert_eq!(one("$(A", &vars), "$(A");
        assert_eq!(one("cost $5", &vars), "cost $5");
        assert_eq!(one("end$", &vars), "end$");
        assert_eq!(one("$(A)$(A)", &vars), "xx");
        assert_eq!(one("é$é", &vars), "é$é");
    }

    #[test]
    fn later_entries_win() {
        let vars = env(&[("A", Some("1")), ("A", Some("2"))]);
        assert_eq!(one("$(A)", &vars), "2");
    }
}
