//! `$(VAR)` expansion as Kubernetes defines it (third_party/forked/golang/
//! expansion): `$$` is an escaped `$`, `$(NAME)` is replaced by the value
//! when the name is known and kept as written otherwise, anything else
//! after `$` is kept literally.

/// Expands `input` with `lookup`.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let (read, is_var, advance) = try_read_variable_name(&input[cursor + 1..]);
            if is_var {
                match lookup(&read) {
                    Some(v) => out.push_str(&v),
                    None => {
                        out.push_str("$(");
                        out.push_str(&read);
                        out.push(')');
                    }
                }
            } else {
                out.push_str(&read);
            }
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

/// `tryReadVariableName`: (text to emit or variable name, whether it is a
/// variable name, bytes consumed after the `$`).
fn try_read_variable_name(input: &str) -> (String, bool, usize) {
    match input.as_bytes()[0] {
        b'$' => ("$".to_string(), false, 1),
        b'(' => match input[1..].find(')') {
            Some(close) => (input[1..close + 1].to_string(), true, close + 2),
            None => ("$(".to_string(), false, 1),
        },
        _ => {
            // An operator that starts no expression: keep it and the
            // character after it.
            let next = input.chars().next().map_or(1, char::len_utf8);
            (format!("${}", &input[..next]), false, next)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn exp(s: &str) -> String {
        let vars: HashMap<&str, &str> =
            HashMap::from([("VAR_A", "A"), ("VAR_B", "B"), ("EMPTY", "")]);
        expand(s, &|n| vars.get(n).map(|v| v.to_string()))
    }

    #[test]
    fn upstream_cases() {
        assert_eq!(exp("$(VAR_A)"), "A");
        assert_eq!(exp("___$(VAR_B)___"), "___B___");
        assert_eq!(exp("$(VAR_A)-$(VAR_B)"), "A-B");
        assert_eq!(exp("$(UNKNOWN)"), "$(UNKNOWN)");
        assert_eq!(exp("$$(VAR_A)"), "$(VAR_A)");
        assert_eq!(exp("$$$(VAR_A)"), "$A");
        assert_eq!(exp("$(EMPTY)x"), "x");
        assert_eq!(exp("$(VAR_A"), "$(VAR_A");
        assert_eq!(exp("$VAR_A"), "$VAR_A");
        assert_eq!(exp("tail$"), "tail$");
        assert_eq!(exp("$"), "$");
        assert_eq!(exp("$()"), "$()");
        assert_eq!(exp("é$(VAR_A)é"), "éAé");
    }
}
