//! Resolving a probe's `port` (a number, or the name of one of the
//! container's ports) like kubelet's `probe.ResolveContainerPort`.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use keelson_common::gofmt;

/// Why a probe's or hook's `port` names no port; the texts are upstream's
/// (Go's `strconv.Atoi` and `probe.ResolveContainerPort`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// Neither a port name of the container nor a number.
    #[error("strconv.Atoi: parsing {}: invalid syntax", gofmt::quote(.0))]
    InvalidSyntax(String),
    /// A number that does not fit an int.
    #[error("strconv.Atoi: parsing {}: value out of range", gofmt::quote(.0))]
    OutOfRange(String),
    /// A number outside 1-65535.
    #[error("invalid port number: {0}")]
    InvalidNumber(i64),
}

/// Resolves `port` against `container`'s `ports`.
///
/// A string is first looked up as a port name; failing that it is parsed as
/// a number ("maybe it was an int stored as string"). The error texts are
/// upstream's, e.g. `strconv.Atoi: parsing "http": invalid syntax` for a name
/// that no port has, and `invalid port number: 0`.
pub fn resolve_container_port(port: &IntOrString, container: &Container) -> Result<u16, PortError> {
    let number: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match named {
                Some(n) => n,
                None => parse_go_int(name)?,
            }
        }
    };
    if number > 0 && number < 65536 {
        u16::try_from(number).map_err(|_| PortError::InvalidNumber(number))
    } else {
        Err(PortError::InvalidNumber(number))
    }
}

/// Parses like Go's `strconv.Atoi`, with its error texts.
fn parse_go_int(s: &str) -> Result<i64, PortError> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PortError::InvalidSyntax(s.to_string()));
    }
    s.parse::<i64>()
        .map_err(|_| PortError::OutOfRange(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn container() -> Container {
        Container {
            name: "app".into(),
            ports: Some(vec![
                ContainerPort {
                    name: Some("http".into()),
                    container_port: 8080,
                    ..Default::default()
                },
                ContainerPort {
                    name: Some("bad".into()),
                    container_port: 0,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn resolves_numbers_names_and_numeric_strings() {
        let c = container();
        assert_eq!(
            resolve_container_port(&IntOrString::Int(9000), &c),
            Ok(9000)
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
    }

    #[test]
    fn errors_read_like_upstream() {
        let c = container();
        assert_eq!(
            resolve_container_port(&IntOrString::String("metrics".into()), &c)
                .map_err(|e| e.to_string()),
            Err("strconv.Atoi: parsing \"metrics\": invalid syntax".into())
        );
        assert_eq!(
            resolve_container_port(&IntOrString::Int(0), &c).map_err(|e| e.to_string()),
            Err("invalid port number: 0".into())
        );
        assert_eq!(
            resolve_container_port(&IntOrString::Int(70000), &c).map_err(|e| e.to_string()),
            Err("invalid port number: 70000".into())
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("bad".into()), &c)
                .map_err(|e| e.to_string()),
            Err("invalid port number: 0".into())
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("99999999999999999999".into()), &c)
                .map_err(|e| e.to_string()),
            Err("strconv.Atoi: parsing \"99999999999999999999\": value out of range".into())
        );
    }
}
