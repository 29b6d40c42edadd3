//! kubeconfig files pointing at the server.

use std::path::Path;

use base64::Engine;

use super::error::TestApiError;

/// Renders a kubeconfig for `server` trusting `ca_pem`, with an optional
/// bearer token, context namespace `default`.
pub fn render(server: &str, ca_pem: &str, token: Option<&str>) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user = match token {
        Some(t) => format!("    token: {t}\n"),
        None => "    {}\n".to_string(),
    };
    let user_block = if token.is_some() {
        format!("  user:\n{user}")
    } else {
        "  user: {}\n".to_string()
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: keelson-testapi\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: keelson-testapi-user\n{user_block}contexts:\n- name: keelson-testapi\n  context:\n    cluster: keelson-testapi\n    user: keelson-testapi-user\n    namespace: default\ncurrent-context: keelson-testapi\npreferences: {{}}\n"
    )
}

/// Renders a kubeconfig authenticating with a client certificate.
pub fn render_with_cert(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: keelson-testapi\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: keelson-testapi-user\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: keelson-testapi\n  context:\n    cluster: keelson-testapi\n    user: keelson-testapi-user\n    namespace: default\ncurrent-context: keelson-testapi\npreferences: {{}}\n",
        b(ca_pem),
        b(cert_pem),
        b(key_pem)
    )
}

/// Writes text to a file with mode 0600, creating the directory.
pub fn write_text(path: &Path, text: &str) -> Result<(), TestApiError> {
    let werr = |source| TestApiError::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(werr)?;
    }
    std::fs::write(path, text).map_err(werr)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(werr)?;
    Ok(())
}

/// Writes a kubeconfig file (mode 0600).
pub fn write(
    path: &Path,
    server: &str,
    ca_pem: &str,
    token: Option<&str>,
) -> Result<(), TestApiError> {
    write_text(path, &render(server, ca_pem, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_kubeconfig() {
        let text = render("https://127.0.0.1:1", "PEM", Some("abc"));
        let kc = kube::config::Kubeconfig::from_yaml(&text).expect("valid kubeconfig");
        assert_eq!(kc.current_context.as_deref(), Some("keelson-testapi"));
        let anon = render("https://127.0.0.1:1", "PEM", None);
        assert!(kube::config::Kubeconfig::from_yaml(&anon).is_ok());
    }
}
