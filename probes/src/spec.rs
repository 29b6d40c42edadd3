//! A probe as the prober runs it, built from the Kubernetes `Probe` and
//! `Container`: API defaults filled in, invalid values made safe, the exec
//! command expanded and ports resolved once.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

use crate::expand::expand_command;
use crate::port::{PortError, resolve_container_port};
use crate::result::ProbeKind;

/// `initialDelaySeconds` when unset.
pub const DEFAULT_INITIAL_DELAY_SECONDS: i32 = 0;
/// `periodSeconds` when unset (API server default).
pub const DEFAULT_PERIOD_SECONDS: i32 = 10;
/// `timeoutSeconds` when unset (API server default).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 1;
/// `successThreshold` when unset (API server default).
pub const DEFAULT_SUCCESS_THRESHOLD: i32 = 1;
/// `failureThreshold` when unset (API server default).
pub const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

/// One probe of one container, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// What to check.
    pub handler: ProbeHandler,
    /// `initialDelaySeconds`: no probe before the container has run this long.
    pub initial_delay: Duration,
    /// `periodSeconds`.
    pub period: Duration,
    /// `timeoutSeconds`.
    pub timeout: Duration,
    /// `successThreshold` (always 1 for liveness and startup, as the API
    /// requires).
    pub success_threshold: u32,
    /// `failureThreshold`.
    pub failure_threshold: u32,
    /// Probe-level `terminationGracePeriodSeconds` (for liveness and
    /// startup kills); `None` means "use the pod's".
    pub termination_grace_period_seconds: Option<i64>,
}

/// The check a probe performs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeHandler {
    /// Run a command in the container (through [`crate::Exec`]); the command
    /// has `$(VAR)` references to the container's static env expanded.
    Exec {
        /// The command and its arguments.
        command: Vec<String>,
    },
    /// An HTTP(S) GET.
    HttpGet(HttpGetSpec),
    /// A TCP connect.
    TcpSocket {
        /// `host`; the pod IP when `None`.
        host: Option<String>,
        /// The resolved port, or the error resolving it (reported each run
        /// as a probe error, like upstream).
        port: Result<u16, PortError>,
    },
    /// A `grpc.health.v1.Health/Check` call, plaintext, to the pod IP.
    Grpc {
        /// `port`, as given (validated when run).
        port: i32,
        /// `service`; empty when unset.
        service: String,
    },
    /// The probe names no handler (rejected by API validation; reported each
    /// run as a probe error, like upstream).
    Missing,
}

/// An `httpGet` action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGetSpec {
    /// `scheme`, lower-cased; `http` when unset.
    pub scheme: String,
    /// `host`; the pod IP when `None`.
    pub host: Option<String>,
    /// The resolved port, or the error resolving it.
    pub port: Result<u16, PortError>,
    /// `path` as written (may carry a query).
    pub path: String,
    /// `httpHeaders`, in order.
    pub headers: Vec<(String, String)>,
}

/// Something about a probe that was out of range and replaced by a safe value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecWarning {
    /// The field, e.g. `periodSeconds`.
    pub field: &'static str,
    /// The value found.
    pub value: i64,
    /// The value used instead.
    pub used: i64,
}

impl ProbeSpec {
    /// Builds the spec of `kind` probe `probe` of `container`, returning what
    /// had to be corrected. Missing fields get the API defaults; values the
    /// API would reject (period, timeout or thresholds below 1, a negative
    /// initial delay, a success threshold other than 1 for liveness or
    /// startup) are replaced by their defaults so a bad object cannot make a
    /// worker spin.
    pub fn from_k8s(
        kind: ProbeKind,
        probe: &Probe,
        container: &Container,
    ) -> (ProbeSpec, Vec<SpecWarning>) {
        let mut warnings = Vec::new();
        let mut field = |name: &'static str, value: Option<i32>, default: i32, min: i32| -> i32 {
            match value {
                None => default,
                Some(v) if v < min => {
                    warnings.push(SpecWarning {
                        field: name,
                        value: i64::from(v),
                        used: i64::from(default),
                    });
                    default
                }
                Some(v) => v,
            }
        };
        let initial_delay = field(
            "initialDelaySeconds",
            probe.initial_delay_seconds,
            DEFAULT_INITIAL_DELAY_SECONDS,
            0,
        );
        let period = field(
            "periodSeconds",
            probe.period_seconds,
            DEFAULT_PERIOD_SECONDS,
            1,
        );
        let timeout = field(
            "timeoutSeconds",
            probe.timeout_seconds,
            DEFAULT_TIMEOUT_SECONDS,
            1,
        );
        let mut success = field(
            "successThreshold",
            probe.success_threshold,
            DEFAULT_SUCCESS_THRESHOLD,
            1,
        );
        let failure = field(
            "failureThreshold",
            probe.failure_threshold,
            DEFAULT_FAILURE_THRESHOLD,
            1,
        );
        if kind != ProbeKind::Readiness && success != 1 {
            warnings.push(SpecWarning {
                field: "successThreshold",
                value: i64::from(success),
                used: 1,
            });
            success = 1;
        }
        let spec = ProbeSpec {
            handler: ProbeHandler::from_k8s(probe, container),
            initial_delay: secs(initial_delay),
            period: secs(period),
            timeout: secs(timeout),
            success_threshold: u32::try_from(success).unwrap_or(1),
            failure_threshold: u32::try_from(failure).unwrap_or(3),
            termination_grace_period_seconds: probe.termination_grace_period_seconds,
        };
        (spec, warnings)
    }
}

fn secs(n: i32) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}

impl ProbeHandler {
    /// Picks the handler like upstream: exec, then httpGet, then tcpSocket,
    /// then grpc.
    pub fn from_k8s(probe: &Probe, container: &Container) -> ProbeHandler {
        if let Some(exec) = &probe.exec {
            let command = exec.command.clone().unwrap_or_default();
            let env = container.env.as_deref().unwrap_or(&[]);
            return ProbeHandler::Exec {
                command: expand_command(&command, env),
            };
        }
        if let Some(get) = &probe.http_get {
            let scheme = get.scheme.as_deref().unwrap_or("").to_ascii_lowercase();
            return ProbeHandler::HttpGet(HttpGetSpec {
                scheme: if scheme.is_empty() {
                    "http".to_string()
                } else {
                    scheme
                },
                host: get.host.clone().filter(|h| !h.is_empty()),
                port: resolve_container_port(&get.port, container),
                path: get.path.clone().unwrap_or_default(),
                headers: get
                    .http_headers
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
            });
        }
        if let Some(tcp) = &probe.tcp_socket {
            return ProbeHandler::TcpSocket {
                host: tcp.host.clone().filter(|h| !h.is_empty()),
                port: resolve_container_port(&tcp.port, container),
            };
        }
        if let Some(grpc) = &probe.grpc {
            return ProbeHandler::Grpc {
                port: grpc.port,
                service: grpc.service.clone().unwrap_or_default(),
            };
        }
        ProbeHandler::Missing
    }
}

/// The probes a container declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerProbes {
    /// `livenessProbe`.
    pub liveness: Option<ProbeSpec>,
    /// `readinessProbe`.
    pub readiness: Option<ProbeSpec>,
    /// `startupProbe`.
    pub startup: Option<ProbeSpec>,
}

impl ContainerProbes {
    /// Builds the three specs of `container`, with the corrections made.
    pub fn from_container(
        container: &Container,
    ) -> (ContainerProbes, Vec<(ProbeKind, SpecWarning)>) {
        let mut warnings = Vec::new();
        let mut build = |kind: ProbeKind, probe: &Option<Probe>| {
            probe.as_ref().map(|p| {
                let (spec, w) = ProbeSpec::from_k8s(kind, p, container);
                warnings.extend(w.into_iter().map(|w| (kind, w)));
                spec
            })
        };
        let probes = ContainerProbes {
            liveness: build(ProbeKind::Liveness, &container.liveness_probe),
            readiness: build(ProbeKind::Readiness, &container.readiness_probe),
            startup: build(ProbeKind::Startup, &container.startup_probe),
        };
        (probes, warnings)
    }

    /// The spec of one kind.
    pub fn get(&self, kind: ProbeKind) -> Option<&ProbeSpec> {
        match kind {
            ProbeKind::Liveness => self.liveness.as_ref(),
            ProbeKind::Readiness => self.readiness.as_ref(),
            ProbeKind::Startup => self.startup.as_ref(),
        }
    }

    /// True when the container has at least one probe.
    pub fn any(&self) -> bool {
        self.liveness.is_some() || self.readiness.is_some() || self.startup.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerPort, EnvVar, ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, TCPSocketAction,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn container() -> Container {
        Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            env: Some(vec![EnvVar {
                name: "F".into(),
                value: Some("/tmp/ready".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn missing_fields_get_api_defaults() {
        let probe = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Default::default()
        };
        let (spec, warnings) = ProbeSpec::from_k8s(ProbeKind::Readiness, &probe, &container());
        assert!(warnings.is_empty());
        assert_eq!(spec.initial_delay, Duration::ZERO);
        assert_eq!(spec.period, Duration::from_secs(10));
        assert_eq!(spec.timeout, Duration::from_secs(1));
        assert_eq!(spec.success_threshold, 1);
        assert_eq!(spec.failure_threshold, 3);
    }

    #[test]
    fn invalid_values_are_replaced_safely() {
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction {
                host: None,
                port: IntOrString::Int(80),
            }),
            initial_delay_seconds: Some(-5),
            period_seconds: Some(0),
            timeout_seconds: Some(-1),
            success_threshold: Some(0),
            failure_threshold: Some(0),
            ..Default::default()
        };
        let (spec, warnings) = ProbeSpec::from_k8s(ProbeKind::Readiness, &probe, &container());
        assert_eq!(spec.initial_delay, Duration::ZERO);
        assert_eq!(spec.period, Duration::from_secs(10));
        assert_eq!(spec.timeout, Duration::from_secs(1));
        assert_eq!((spec.success_threshold, spec.failure_threshold), (1, 3));
        let fields: Vec<_> = warnings.iter().map(|w| w.field).collect();
        assert_eq!(
            fields,
            [
                "initialDelaySeconds",
                "periodSeconds",
                "timeoutSeconds",
                "successThreshold",
                "failureThreshold"
            ]
        );
    }

    #[test]
    fn liveness_success_threshold_is_forced_to_one() {
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction {
                host: None,
                port: IntOrString::Int(80),
            }),
            success_threshold: Some(3),
            ..Default::default()
        };
        let (spec, warnings) = ProbeSpec::from_k8s(ProbeKind::Liveness, &probe, &container());
        assert_eq!(spec.success_threshold, 1);
        assert_eq!(
            warnings,
            [SpecWarning {
                field: "successThreshold",
                value: 3,
                used: 1
            }]
        );
        let (spec, _) = ProbeSpec::from_k8s(ProbeKind::Readiness, &probe, &container());
        assert_eq!(spec.success_threshold, 3);
    }

    #[test]
    fn handlers_are_built_with_upstream_precedence_and_resolution() {
        let c = container();
        let exec = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["cat".into(), "$(F)".into()]),
            }),
            tcp_socket: Some(TCPSocketAction {
                host: None,
                port: IntOrString::Int(80),
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeHandler::from_k8s(&exec, &c),
            ProbeHandler::Exec {
                command: vec!["cat".into(), "/tmp/ready".into()]
            }
        );
        let http = Probe {
            http_get: Some(HTTPGetAction {
                scheme: Some("HTTPS".into()),
                port: IntOrString::String("web".into()),
                path: Some("/healthz".into()),
                host: Some(String::new()),
                http_headers: Some(vec![HTTPHeader {
                    name: "X-A".into(),
                    value: "1".into(),
                }]),
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeHandler::from_k8s(&http, &c),
            ProbeHandler::HttpGet(HttpGetSpec {
                scheme: "https".into(),
                host: None,
                port: Ok(8080),
                path: "/healthz".into(),
                headers: vec![("X-A".into(), "1".into())],
            })
        );
        let grpc = Probe {
            grpc: Some(GRPCAction {
                port: 9000,
                service: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeHandler::from_k8s(&grpc, &c),
            ProbeHandler::Grpc {
                port: 9000,
                service: String::new()
            }
        );
        assert_eq!(
            ProbeHandler::from_k8s(&Probe::default(), &c),
            ProbeHandler::Missing
        );
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                host: Some("db".into()),
                port: IntOrString::String("nope".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeHandler::from_k8s(&tcp, &c),
            ProbeHandler::TcpSocket {
                host: Some("db".into()),
                port: Err(PortError::InvalidSyntax("nope".into()))
            }
        );
    }
}
