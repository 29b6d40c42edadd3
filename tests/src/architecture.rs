//! The workspace's dependency rules (issue 31), checked on the source tree
//! by the unit tests below (`cargo test -p keelson-tests --lib architecture`):
//!
//! 1. **Crates point down.** [`CRATE_DEPS`]: the workspace crates each
//!    crate may depend on. The binary wires the roles; the node role
//!    (`keelson-node`) never sees the binary or the proxy role; what both
//!    roles share (`keelson-common`) knows neither.
//! 2. **Modules point down.** [`LAYERS`]: for the binary, the node role and
//!    the shared crate, the top-level modules from the bottom up; a module
//!    imports (`crate::x`) only modules below it. [`KNOWN_UPWARD`] lists
//!    the imports that still point up (debt, to be removed); the test also
//!    fails when one of them is gone, so the list stays true.
//! 3. **No circles between siblings.** In every library crate, the files
//!    and folders of one folder do not import each other in a circle
//!    (`super::x` / `crate::path::x`), the folder's `mod.rs` aside.
//! 4. **The map matches the territory.** DESIGN.md's crate table (section
//!    "Crates": crate, folder, what it is, may depend on) has one row per
//!    workspace member, names the crate its `Cargo.toml` names, and lists
//!    exactly the crates [`CRATE_DEPS`] allows.
//!
//! The scan is textual: comments and everything after a file's first
//! `#[cfg(test)]` are ignored, as are `tests.rs` files and `tests/` folders.

/// Crate folder, the workspace crates it may depend on.
pub const CRATE_DEPS: &[(&str, &[&str])] = &[
    ("common", &[]),
    ("cri", &[]),
    ("probes", &["keelson-common"]),
    ("netplane", &[]),
    ("node", &["keelson-common", "keelson-cri", "keelson-probes"]),
    (
        "agent",
        &[
            "keelson-common",
            "keelson-node",
            "keelson-cri",
            "keelson-netplane",
        ],
    ),
    (
        "tests",
        &[
            "keelson",
            "keelson-node",
            "keelson-common",
            "keelson-cri",
            "keelson-probes",
            "keelson-netplane",
        ],
    ),
];

/// Source folder, its top-level modules from the bottom up.
pub const LAYERS: &[(&str, &[&str])] = &[
    (
        "common/src",
        &[
            "error_chain",
            "gofmt",
            "expansion",
            "clock",
            "mountinfo",
            "version",
            "duration",
            "quantity",
            "strategic_patch",
            "lifecycle",
            "observability",
            "introspection",
            "events",
            "apiclient",
        ],
    ),
    (
        // The node role: configuration and host facts at the bottom, then
        // node status, eviction, stats and garbage collection, the volumes
        // pods mount, the pods themselves (source -> admission -> workers ->
        // runtime -> status), and the parts that only read them.
        "node/src",
        &[
            "config",
            "node_ip",
            "certificates",
            "pod",
            "cgroups",
            "downward",
            "logs",
            "preflight",
            "plugins",
            "devices",
            "status",
            "csi",
            "stats",
            "gc",
            "eviction",
            "shutdown",
            "volumes",
            "credentials",
            "pods",
            "introspect",
            "lease",
            "server",
            "podresources",
        ],
    ),
    (
        "agent/src",
        &[
            "config",
            "logging",
            "cli",
            "role",
            "proxy",
            "diagnose",
            "migrate",
            "run",
            "node_role",
            "commands",
            // The binaries' mains (src/bin/keelson-proxy.rs; src/main.rs is
            // the crate root).
            "bin",
        ],
    ),
];

/// Imports that still point up: (source folder, from, to). Each is debt:
/// the shared item belongs below both modules.
pub const KNOWN_UPWARD: &[(&str, &str, &str)] = &[
    // Validation calls pods::admission::sysctl::check_pattern,
    // pods::runtime::pull_records and stats::cpu_rate::MIN_RATE_WINDOW.
    ("node/src", "config", "pods"),
    ("node/src", "config", "stats"),
];

/// Imports in the library code of one file: the first segment after each
/// `crate::` or run of `super::` (with how many `super::`), braces expanded.
fn imports(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let boundary = i == 0 || {
            let c = bytes[i - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
        };
        let (supers, path) = if boundary && rest.starts_with("crate::") {
            (0, &rest["crate::".len()..])
        } else if boundary && rest.starts_with("super::") {
            let mut n = 0;
            let mut r = rest;
            while let Some(t) = r.strip_prefix("super::") {
                n += 1;
                r = t;
            }
            (n, r)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        if let Some(inner) = path.strip_prefix('{') {
            let end = inner.find('}').unwrap_or(inner.len());
            for part in inner[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.push((supers, name.to_string()));
                }
            }
        } else {
            let name = ident(path);
            if !name.is_empty() {
                out.push((supers, name.to_string()));
            }
        }
        i = text.len() - path.len();
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// A file's library code: no comments, nothing from `#[cfg(test)]` on.
fn library_code(text: &str) -> String {
    let cut = text.find("#[cfg(test)]").unwrap_or(text.len());
    text[..cut]
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Every library `.rs` file under `dir`, with its module path relative to
/// `dir` (`a.rs` and `a/mod.rs` -> [a], `a/b.rs` -> [a, b]).
fn files(dir: &std::path::Path) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), Vec::<String>::new())];
    while let Some((d, module)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.is_dir() {
                if name != "tests" && name != "testdata" {
                    let mut m = module.clone();
                    m.push(name);
                    stack.push((path, m));
                }
            } else if let Some(stem) = name.strip_suffix(".rs") {
                if stem == "tests" {
                    continue;
                }
                let mut m = module.clone();
                if !matches!(stem, "mod" | "lib" | "main") {
                    m.push(stem.to_string());
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                out.push((m, library_code(&text)));
            }
        }
    }
    out
}

/// Edges between the children of `folder` (a module path under `src`):
/// child -> sibling it imports.
fn sibling_edges(
    all: &[(Vec<String>, String)],
    folder: &[String],
) -> std::collections::BTreeSet<(String, String)> {
    let mut edges = std::collections::BTreeSet::new();
    for (module, text) in all {
        if module.len() <= folder.len() || !module.starts_with(folder) {
            continue;
        }
        let child = &module[folder.len()];
        // From `module`, `super::` k times reaches `folder` when k equals
        // the depth below it; `crate::` reaches the root.
        let depth = module.len() - folder.len();
        for (supers, name) in imports(text) {
            let reaches_folder = supers == depth || (supers == 0 && folder.is_empty());
            if reaches_folder && &name != child {
                edges.insert((child.clone(), name));
            }
        }
        if !folder.is_empty() {
            let prefix = format!("crate::{}::", folder.join("::"));
            let mut rest = text.as_str();
            while let Some(i) = rest.find(&prefix) {
                rest = &rest[i + prefix.len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(inner) => inner[..inner.find('}').unwrap_or(inner.len())]
                        .split(',')
                        .map(|p| ident(p.trim()))
                        .collect(),
                    None => vec![ident(rest)],
                };
                for n in names {
                    if !n.is_empty() && n != child {
                        edges.insert((child.clone(), n.to_string()));
                    }
                }
            }
        }
    }
    // Only edges between children of the folder (not to items of mod.rs).
    let children: std::collections::BTreeSet<&String> = all
        .iter()
        .filter(|(m, _)| m.len() > folder.len() && m.starts_with(folder))
        .map(|(m, _)| &m[folder.len()])
        .collect();
    edges
        .into_iter()
        .filter(|(_, t)| children.contains(t))
        .collect()
}

/// The circles (strongly connected sets of two or more) of a graph.
fn circles(edges: &std::collections::BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for &m in next.get(n).map(Vec::as_slice).unwrap_or(&[]) {
                if seen.insert(m) {
                    todo.push(m);
                }
            }
        }
        seen
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    for &n in next.keys() {
        if out.iter().any(|c| c.iter().any(|x| x == n)) {
            continue;
        }
        let from_n = reach(n);
        if !from_n.contains(n) {
            continue;
        }
        let circle: Vec<String> = from_n
            .iter()
            .filter(|m| reach(m).contains(n))
            .map(|m| m.to_string())
            .collect();
        out.push(circle);
    }
    out
}

/// One row of DESIGN.md's crate table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CrateRow {
    name: String,
    folder: String,
    deps: Vec<String>,
}

/// The crate table of DESIGN.md: the first table after the `## Crates`
/// heading, columns crate, folder, what it is, may depend on ("none" or a
/// comma-separated list). Backticks and a folder's trailing `/` are dropped.
fn design_crate_table(design: &str) -> Result<Vec<CrateRow>, String> {
    let section = design
        .split("\n## ")
        .find(|s| s.starts_with("Crates\n"))
        .ok_or("DESIGN.md has no `## Crates` section")?;
    let mut lines = section
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with('|'));
    let header = lines.next().ok_or("the Crates section has no table")?;
    let columns: Vec<String> = cells(header).iter().map(|c| c.to_lowercase()).collect();
    if columns != ["crate", "folder", "what it is", "may depend on"] {
        return Err(format!(
            "the crate table's columns are {columns:?}, expected crate | folder | what it is | may depend on"
        ));
    }
    let mut rows = Vec::new();
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let c = cells(line);
        if c.len() != 4 {
            return Err(format!("crate table row without 4 cells: {line}"));
        }
        let deps = if c[3] == "none" {
            Vec::new()
        } else {
            c[3].split(',').map(|d| d.trim().to_string()).collect()
        };
        rows.push(CrateRow {
            name: c[0].clone(),
            folder: c[1].trim_end_matches('/').to_string(),
            deps,
        });
    }
    Ok(rows)
}

/// The cells of a Markdown table row, trimmed, without backticks.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner
        .split('|')
        .map(|c| c.trim().replace('`', ""))
        .collect()
}

/// The workspace members (folders) and the package name of each, read from
/// the root `Cargo.toml` and the members' own.
fn workspace_members(root: &std::path::Path) -> Result<Vec<(String, String)>, String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).map_err(|e| e.to_string())?;
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .ok_or("the workspace Cargo.toml has no members list")?;
    let list = line
        .split_once('[')
        .and_then(|(_, r)| r.split_once(']'))
        .map(|(l, _)| l)
        .ok_or("the members list is not on one line")?;
    let mut out = Vec::new();
    for m in list.split(',').map(|m| m.trim().trim_matches('"')) {
        if m.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(root.join(m).join("Cargo.toml"))
            .map_err(|e| format!("{m}/Cargo.toml: {e}"))?;
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_string())
            .ok_or_else(|| format!("{m}/Cargo.toml names no package"))?;
        out.push((m.to_string(), name));
    }
    Ok(out)
}

/// What is wrong between DESIGN.md's crate table, the workspace members
/// (folder, package name) and the dependency rules; each problem says what
/// to change.
fn crate_table_problems(
    rows: &[CrateRow],
    members: &[(String, String)],
    rules: &[(&str, &[&str])],
) -> Vec<String> {
    use std::collections::BTreeSet;
    let mut out = Vec::new();
    let rule = |folder: &str| rules.iter().find(|(d, _)| *d == folder).map(|(_, a)| *a);
    for (folder, name) in members {
        let mine: Vec<&CrateRow> = rows.iter().filter(|r| r.folder == *folder).collect();
        let allowed = rule(folder);
        if allowed.is_none() {
            out.push(format!(
                "workspace member {folder}/ ({name}) has no entry in CRATE_DEPS \
                 (tests/src/architecture.rs): add (\"{folder}\", &[...]) with the \
                 workspace crates it may depend on"
            ));
        }
        match mine.as_slice() {
            [] => {
                let deps = match allowed {
                    None => "<the workspace crates it may depend on>".to_string(),
                    Some([]) => "none".to_string(),
                    Some(a) => a
                        .iter()
                        .map(|d| format!("`{d}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                };
                out.push(format!(
                    "crate {name} ({folder}/) has no row in DESIGN.md's crate table \
                     (section \"Crates\"); add the row:\n\
                     | `{name}` | `{folder}/` | <what it is> | {deps} |"
                ));
            }
            [row] => {
                if row.name != *name {
                    out.push(format!(
                        "DESIGN.md's crate table names the crate in {folder}/ `{}`, \
                         but {folder}/Cargo.toml names it `{name}`",
                        row.name
                    ));
                }
                if let Some(allowed) = allowed {
                    let table: BTreeSet<&str> = row.deps.iter().map(String::as_str).collect();
                    let rules: BTreeSet<&str> = allowed.iter().copied().collect();
                    if table != rules {
                        out.push(format!(
                            "DESIGN.md says {name} may depend on {table:?}, \
                             CRATE_DEPS says {rules:?}: make them agree"
                        ));
                    }
                }
            }
            _ => out.push(format!(
                "DESIGN.md's crate table has {} rows for {folder}/; keep one",
                mine.len()
            )),
        }
    }
    for row in rows {
        if !members.iter().any(|(f, _)| *f == row.folder) {
            out.push(format!(
                "DESIGN.md's crate table has a row for {}/ ({}), which is not a \
                 workspace member: remove the row",
                row.folder, row.name
            ));
        }
    }
    for (folder, _) in rules {
        if !members.iter().any(|(f, _)| f == folder) {
            out.push(format!(
                "CRATE_DEPS has an entry for {folder}, which is not a workspace member: remove it"
            ));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn crates_depend_downward_only() {
        let root = workspace();
        let mut bad = Vec::new();
        for (dir, allowed) in CRATE_DEPS {
            let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
            let deps = manifest
                .split("\n[")
                .find(|s| s.starts_with("dependencies]"))
                .unwrap_or("");
            for line in deps.lines().skip(1) {
                let name = line.split(['.', ' ', '=']).next().unwrap_or("");
                if (name == "keelson" || name.starts_with("keelson-")) && !allowed.contains(&name) {
                    bad.push(format!("{dir} depends on {name}"));
                }
            }
        }
        assert!(
            bad.is_empty(),
            "dependencies pointing up:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn modules_depend_downward_only() {
        let root = workspace();
        let mut up = Vec::new();
        for (dir, order) in LAYERS {
            let all = files(&root.join(dir));
            let mut tops: Vec<&String> = all.iter().filter_map(|(m, _)| m.first()).collect();
            tops.sort();
            tops.dedup();
            for t in &tops {
                assert!(
                    order.contains(&t.as_str()),
                    "{dir}: top-level module {t} has no place in LAYERS"
                );
            }
            let rank = |m: &str| order.iter().position(|x| *x == m);
            for (from, to) in sibling_edges(&all, &[]) {
                if let (Some(f), Some(t)) = (rank(&from), rank(&to))
                    && t > f
                {
                    up.push((dir.to_string(), from, to));
                }
            }
        }
        let known: Vec<(String, String, String)> = KNOWN_UPWARD
            .iter()
            .map(|(d, f, t)| (d.to_string(), f.to_string(), t.to_string()))
            .collect();
        let new: Vec<String> = up
            .iter()
            .filter(|e| !known.contains(e))
            .map(|(d, f, t)| format!("{d}: {f} -> {t}"))
            .collect();
        assert!(
            new.is_empty(),
            "imports pointing up (move the shared item below both):\n{}",
            new.join("\n")
        );
        let gone: Vec<String> = known
            .iter()
            .filter(|e| !up.contains(e))
            .map(|(d, f, t)| format!("{d}: {f} -> {t}"))
            .collect();
        assert!(
            gone.is_empty(),
            "KNOWN_UPWARD lists imports that are gone; remove them:\n{}",
            gone.join("\n")
        );
    }

    #[test]
    fn no_circles_between_siblings() {
        let root = workspace();
        let mut found = Vec::new();
        for dir in ["common", "node", "cri", "probes", "netplane", "agent"] {
            let all = files(&root.join(dir).join("src"));
            let mut folders: Vec<Vec<String>> = all
                .iter()
                .flat_map(|(m, _)| (0..m.len()).map(|n| m[..n].to_vec()))
                .collect();
            folders.sort();
            folders.dedup();
            for f in folders {
                // The top level of the layered crates is checked more
                // strictly (and with its debt list) above.
                if f.is_empty() && LAYERS.iter().any(|(d, _)| *d == format!("{dir}/src")) {
                    continue;
                }
                for c in circles(&sibling_edges(&all, &f)) {
                    found.push(format!("{dir}/src/{}: {}", f.join("/"), c.join(" <-> ")));
                }
            }
        }
        assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
    }

    #[test]
    fn the_scanner_reads_imports() {
        let code = library_code(
            "use crate::a::B;\nuse super::super::{c, d::E};\n// crate::x\nfn f() { crate::g::h(); }\n#[cfg(test)]\nuse crate::t;",
        );
        assert_eq!(
            imports(&code),
            vec![
                (0, "a".to_string()),
                (2, "c".to_string()),
                (2, "d".to_string()),
                (0, "g".to_string())
            ]
        );
        let e: std::collections::BTreeSet<(String, String)> = [("a", "b"), ("b", "a"), ("b", "c")]
            .iter()
            .map(|(x, y)| (x.to_string(), y.to_string()))
            .collect();
        assert_eq!(circles(&e), vec![vec!["a".to_string(), "b".to_string()]]);
    }

    #[test]
    fn design_crate_table_matches_the_workspace() {
        let root = workspace();
        let design = std::fs::read_to_string(root.join("DESIGN.md")).unwrap();
        let rows = design_crate_table(&design).unwrap();
        let members = workspace_members(&root).unwrap();
        let problems = crate_table_problems(&rows, &members, CRATE_DEPS);
        assert!(
            problems.is_empty(),
            "DESIGN.md's crate table, the workspace and CRATE_DEPS disagree:\n{}",
            problems.join("\n")
        );
    }

    #[test]
    fn the_crate_table_check_names_the_row_to_add() {
        let design = "# x\n\n## Crates\n\ntext\n\n| crate | folder | what it is | may depend on |\n\
                      |---|---|---|---|\n\
                      | `a` | `a/` | the binary | `b` |\n\
                      | `gone` | `gone/` | removed | none |\n\n## Next\n| x | y |\n";
        let rows = design_crate_table(design).unwrap();
        assert_eq!(
            rows,
            vec![
                CrateRow {
                    name: "a".into(),
                    folder: "a".into(),
                    deps: vec!["b".into()]
                },
                CrateRow {
                    name: "gone".into(),
                    folder: "gone".into(),
                    deps: vec![]
                },
            ]
        );
        let members = vec![
            ("a".to_string(), "a".to_string()),
            ("b".to_string(), "keelson-b".to_string()),
        ];
        let rules: &[(&str, &[&str])] = &[("a", &["keelson-b"]), ("b", &[])];
        let problems = crate_table_problems(&rows, &members, rules);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[0].contains(r#"CRATE_DEPS says {"keelson-b"}"#));
        assert!(
            problems[1].ends_with("add the row:\n| `keelson-b` | `b/` | <what it is> | none |"),
            "{}",
            problems[1]
        );
        assert!(problems[2].contains("gone/ (gone), which is not a workspace member"));
        let err = design_crate_table("x\n## Crates\n\n| crate | dir |\n|---|---|\n").unwrap_err();
        assert!(err.contains("columns"), "{err}");
        assert!(design_crate_table("# x\n## Other\n").is_err());
    }
}
