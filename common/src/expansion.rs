//! `$(VAR)` expansion as Kubernetes defines it for container commands,
//! arguments, environment values, `subPathExpr` and exec probes
//! (`third_party/forked/golang/expansion/expand.go`): `$$` is an escaped
//! `$`, `$(NAME)` is replaced by what the mapping gives for `NAME`, an
//! unterminated `$(` and a `$` before anything else stay as written.

/// `expansion.Expand`: every `$(NAME)` in `input` becomes `mapping(NAME)`.
pub fn expand(input: &str, mut mapping: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let Some(next) = after.chars().next() else {
            // A trailing `$`.
            out.push('$');
            rest = after;
            break;
        };
        match next {
            '$' => {
                out.push('$');
                rest = &after[1..];
            }
            '(' => match after.find(')') {
                Some(close) => {
                    out.push_str(&mapping(&after[1..close]));
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            c => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `expansion.Expand` with `MappingFuncFor`: a name `lookup` knows is
/// replaced by its value, any other reference is kept as written.
pub fn expand_known(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    expand(input, |name| {
        lookup(name).unwrap_or_else(|| format!("$({name})"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn exp(s: &str) -> String {
        let vars: HashMap<&str, &str> =
            HashMap::from([("VAR_A", "A"), ("VAR_B", "B"), ("EMPTY", "")]);
        expand_known(s, |n| vars.get(n).map(|v| v.to_string()))
    }

    #[test]
    fn upstream_cases() {
        assert_eq!(exp("$(VAR_A)"), "A");
        assert_eq!(exp("___$(VAR_B)___"), "___B___");
        assert_eq!(exp("$(VAR_A)-$(VAR_B)"), "A-B");
        assert_eq!(exp("$(VAR_A)$(VAR_A)"), "AA");
        assert_eq!(exp("$(UNKNOWN)"), "$(UNKNOWN)");
        assert_eq!(exp("$$(VAR_A)"), "$(VAR_A)");
        assert_eq!(exp("$$$(VAR_A)"), "$A");
        assert_eq!(exp("$(EMPTY)x"), "x");
        assert_eq!(exp("$(VAR_A"), "$(VAR_A");
        assert_eq!(exp("a$$b$("), "a$b$(");
        assert_eq!(exp("$VAR_A"), "$VAR_A");
        assert_eq!(exp("cost $5"), "cost $5");
        assert_eq!(exp("tail$"), "tail$");
        assert_eq!(exp("$"), "$");
        assert_eq!(exp("$()"), "$()");
        assert_eq!(exp("é$(VAR_A)é"), "éAé");
        assert_eq!(exp("é$é"), "é$é");
    }

    #[test]
    fn the_mapping_sees_every_reference() {
        let mut seen = Vec::new();
        let out = expand("$(A)/$(B)/$$(C)", |n| {
            seen.push(n.to_string());
            String::new()
        });
        assert_eq!(out, "//$(C)");
        assert_eq!(seen, ["A", "B"]);
    }
}
