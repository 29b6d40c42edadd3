//! Errors: the Kubernetes `Status` bodies the server answers with, and the
//! error type of the server's own public API.

use serde_json::{Value, json};

/// Error of the test API server's own API (start-up, kubeconfig, client).
#[derive(Debug, thiserror::Error)]
pub enum TestApiError {
    /// Binding or accepting on a socket failed.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address we tried.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Generating or loading the TLS material failed.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// Writing a file (kubeconfig, CA) failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Building a kube client from the written kubeconfig failed.
    #[error("kube client: {0}")]
    Client(String),
    /// Generating the service-account signing key failed.
    #[error("signing key: {0}")]
    SigningKey(String),
    /// An option value is not usable.
    #[error("invalid option {option}: {message}")]
    Option {
        /// The option's name.
        option: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

/// One `causes` entry of a `Status` (field validation errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueDuplicate`, ...
    pub reason: &'static str,
    /// Human text for this field.
    pub message: String,
    /// The field path, e.g. `spec.containers[0].name`.
    pub field: String,
}

/// The `details` of an API error (boxed to keep [`ApiError`] small).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ErrorDetails {
    /// `details.name`.
    pub name: Option<String>,
    /// `details.group`.
    pub group: Option<String>,
    /// `details.kind` (resource plural for most errors, Kind for Invalid).
    pub kind: Option<String>,
    /// `details.causes`.
    pub causes: Vec<Cause>,
    /// `details.retryAfterSeconds` (only for 429/5xx that suggest a retry).
    pub retry_after: Option<u32>,
}

/// An API error, rendered as a `metav1.Status` with the HTTP code, reason
/// and message kube-apiserver would use for the same failure.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` field (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...).
    pub reason: &'static str,
    /// `message` field.
    pub message: String,
    /// `details`.
    pub details: Box<ErrorDetails>,
}

/// A qualified resource as upstream prints it in messages: `pods`, or
/// `endpointslices.discovery.k8s.io`.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: Box::default(),
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> ApiError {
        self.details.group = Some(group.to_string());
        self.details.kind = Some(kind.to_string());
        if !name.is_empty() {
            self.details.name = Some(name.to_string());
        }
        self
    }

    /// 400 BadRequest with a message.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden with upstream's message shape.
    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
        let q = qualified(group, resource);
        let msg = if name.is_empty() {
            format!("{q} is forbidden: {why}")
        } else {
            format!("{q} \"{name}\" is forbidden: {why}")
        };
        ApiError::new(403, "Forbidden", msg).with_details(group, resource, name)
    }

    /// 404 NotFound for a named object.
    pub fn not_found(group: &str, resource: &str, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// 404 for a path that names no resource.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 406 NotAcceptable (e.g. protobuf-only Accept).
    pub fn not_acceptable() -> ApiError {
        ApiError::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/json;stream=watch",
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(ct: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct})"
            ),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict_stale(group: &str, resource: &str, name: &str) -> ApiError {
        ApiError::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 Conflict with a specific reason text.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// 410 Gone with reason `Expired` (too old resourceVersion / continue).
    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 422 Invalid with field causes; `kind` is the object Kind.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> ApiError {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!(
                "{kind}{} \"{name}\" is invalid: {joined}",
                group_suffix(group)
            ),
        )
        .with_details(group, kind, name);
        e.details.causes = causes;
        e
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> ApiError {
        let m = message.into();
        let mut e = ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {m}"),
        );
        e.details.retry_after = Some(1);
        e
    }

    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(504, "Timeout", message);
        e.details.retry_after = Some(1);
        e
    }

    /// An error injected by a test knob: the code with the reason upstream
    /// uses for it.
    pub fn injected(code: u16) -> ApiError {
        let reason = reason_for_code(code);
        let mut e = ApiError::new(
            code,
            reason,
            format!("injected failure (test knob): {reason}"),
        );
        if code == 429 || code >= 500 {
            e.details.retry_after = Some(1);
        }
        e
    }

    /// The `metav1.Status` JSON body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        let d = &self.details;
        if let Some(n) = &d.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &d.group
            && !g.is_empty()
        {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &d.kind {
            details.insert("kind".into(), json!(k));
        }
        if !d.causes.is_empty() {
            let causes: Vec<Value> = d
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(r) = d.retry_after {
            details.insert("retryAfterSeconds".into(), json!(r));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

fn group_suffix(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!(".{group}")
    }
}

/// The `reason` upstream attaches to a bare HTTP code.
pub fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// Shorthand for a required-field cause.
pub fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        message: "Required value".into(),
        field: field.into(),
    }
}

/// Shorthand for an invalid-value cause; `value` is printed as upstream does.
pub fn invalid_value(field: &str, value: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: \"{value}\": {why}"),
        field: field.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_status_matches_upstream_shape() {
        let s = ApiError::not_found("discovery.k8s.io", "endpointslices", "a").to_status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(
            s["message"],
            "endpointslices.discovery.k8s.io \"a\" not found"
        );
        assert_eq!(s["details"]["group"], "discovery.k8s.io");
        assert_eq!(s["details"]["kind"], "endpointslices");
    }

    #[test]
    fn invalid_lists_causes() {
        let e = ApiError::invalid("", "Pod", "p", vec![required("spec.containers")]);
        assert_eq!(
            e.message,
            "Pod \"p\" is invalid: spec.containers: Required value"
        );
        assert_eq!(
            e.to_status()["details"]["causes"][0]["field"],
            "spec.containers"
        );
    }
}
