//! `$(VAR)` expansion of `subPathExpr` with the container's environment
//! (kubelet's `ExpandContainerVolumeMounts`): `$$` is a literal `$`, an
//! unterminated `$(` stays as written, and a reference to a variable that
//! is unset or empty is an error naming every missing variable.

use std::collections::{BTreeSet, HashMap};

use keelson_common::expansion::expand;

/// Expands `expr`; `Err` lists the missing variables (`missing value for A, B`).
pub fn expand_sub_path(expr: &str, env: &[(String, String)]) -> Result<String, String> {
    let vars: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut missing = BTreeSet::new();
    let out = expand(expr, |name| match vars.get(name) {
        Some(v) if !v.is_empty() => (*v).to_string(),
        other => {
            missing.insert(name.to_string());
            other.map(|v| (*v).to_string()).unwrap_or_default()
        }
    });
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "missing value for {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn expansion_rules() {
        let env = vec![
            ("POD".to_string(), "web-0".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        assert_eq!(expand_sub_path("logs/$(POD)", &env).unwrap(), "logs/web-0");
        assert_eq!(expand_sub_path("a$$b$(", &env).unwrap(), "a$b$(");
        assert_eq!(expand_sub_path("$x", &env).unwrap(), "$x");
        assert_eq!(expand_sub_path("trail$", &env).unwrap(), "trail$");
        assert_eq!(
            expand_sub_path("$(NOPE)/$(EMPTY)", &env).unwrap_err(),
            "missing value for EMPTY, NOPE"
        );
    }
}
