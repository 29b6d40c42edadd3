//! The container hash kubelet stores in the `io.kubernetes.container.hash`
//! annotation and compares to decide whether a running container still
//! matches its spec. It must equal kubelet's bit for bit, so that keelson
//! adopts containers a kubelet started (and the other way round) without
//! restarting them: FNV-32a over Go's `%#v` rendering (spew) of the JSON of
//! `{"image": ..., "name": ...}` — the only container fields a pod update
//! may change.

use k8s_openapi::api::core::v1::Container;

use crate::pod::fnv::fnv32a;

/// kubelet's `HashContainer`.
pub fn hash_container(c: &Container) -> u64 {
    let image = c.image.as_deref().unwrap_or_default();
    // encoding/json marshals a map with sorted keys and HTML-safe escaping.
    let json = format!(
        "{{\"image\":{},\"name\":{}}}",
        go_json_string(image),
        go_json_string(&c.name)
    );
    // spew's %#v of a []byte: "([]uint8)[b0 b1 ...]" in decimal.
    let mut rendered = String::with_capacity(json.len() * 4 + 12);
    rendered.push_str("([]uint8)[");
    for (i, b) in json.bytes().enumerate() {
        if i > 0 {
            rendered.push(' ');
        }
        rendered.push_str(&b.to_string());
    }
    rendered.push(']');
    u64::from(fnv32a(rendered.as_bytes()))
}

/// The hash as kubelet writes it into the annotation (lower-case hex).
pub fn hash_label(c: &Container) -> String {
    format!("{:x}", hash_container(c))
}

/// A JSON string literal as Go's `encoding/json` writes it (escapes `<`,
/// `>`, `&`, U+2028 and U+2029; invalid bytes cannot occur in a `&str`).
fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, image: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(image.into()),
            ..Default::default()
        }
    }

    #[test]
    fn matches_kubelets_reference_value() {
        // pkg/kubelet/container/container_hash_test.go (v1.31+): 0x8e45cbd0.
        let c = Container {
            command: Some(vec!["/bin/testcmd".into()]),
            ..container("test_container", "foo/image:v1")
        };
        assert_eq!(hash_container(&c), 0x8e45_cbd0);
        assert_eq!(hash_label(&c), "8e45cbd0");
    }

    #[test]
    fn only_name_and_image_count() {
        let a = container("app", "busybox:1");
        let mut b = a.clone();
        b.args = Some(vec!["x".into()]);
        assert_eq!(hash_container(&a), hash_container(&b));
        assert_ne!(
            hash_container(&a),
            hash_container(&container("app", "busybox:2"))
        );
    }

    #[test]
    fn html_characters_are_escaped_as_go_does() {
        assert_eq!(go_json_string("a<b>&"), "\"a\\u003cb\\u003e\\u0026\"");
    }
}
