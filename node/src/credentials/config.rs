//! The credential provider configuration kubelet reads with
//! `--image-credential-provider-config` (`CredentialProviderConfig`,
//! `kubelet.config.k8s.io/v1`, also `v1beta1` and `v1alpha1`), read and
//! validated as `pkg/credentialprovider/plugin/config.go` does:
//!
//! - the path is one file, or a directory whose `*.json`, `*.yaml` and
//!   `*.yml` files are read in lexicographic order and their providers
//!   merged (a name twice is an error);
//! - the content hash (`sha256:` over each file's length, big-endian u64,
//!   and bytes) is what `kubelet_credential_provider_config_info` shows;
//! - decoding is strict (an unknown field is an error);
//! - `validateCredentialProviderConfig` with kubelet's field error texts,
//!   all errors in one message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keelson_common::gofmt;
use serde::Deserialize;

use super::url_match::parse_schemeless;

/// The group of the configuration.
pub const GROUP: &str = "kubelet.config.k8s.io";
/// The configuration versions kubelet decodes.
const CONFIG_VERSIONS: &[&str] = &["v1", "v1alpha1", "v1beta1"];
/// The exec protocol versions a provider may speak (`apiVersions`).
pub const PROTOCOL_VERSIONS: &[&str] = &[
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];
/// The only protocol version with `tokenAttributes`.
pub const PROTOCOL_V1: &str = "credentialprovider.kubelet.k8s.io/v1";
/// `cacheType` values (`validCacheTypes`, sorted as `sets.List`).
pub const CACHE_TYPES: &[&str] = &["ServiceAccount", "Token"];

/// `CredentialProviderConfig`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialProviderConfig {
    /// `apiVersion`.
    #[serde(default)]
    pub api_version: String,
    /// `kind`.
    #[serde(default)]
    pub kind: String,
    /// `providers`.
    #[serde(default)]
    pub providers: Vec<CredentialProvider>,
}

/// One plugin (`CredentialProvider`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialProvider {
    /// The plugin's name: the executable in the bin dir.
    #[serde(default)]
    pub name: String,
    /// Images (globs in the host) the plugin is asked for.
    #[serde(default)]
    pub match_images: Vec<String>,
    /// How long a response without `cacheDuration` is cached.
    #[serde(default)]
    pub default_cache_duration: Option<SignedDuration>,
    /// The exec protocol version.
    #[serde(default)]
    pub api_version: String,
    /// Command-line arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment added to the agent's.
    #[serde(default)]
    pub env: Vec<ExecEnvVar>,
    /// Service account token mode.
    #[serde(default)]
    pub token_attributes: Option<TokenAttributes>,
}

/// `ExecEnvVar`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecEnvVar {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `ServiceAccountTokenAttributes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenAttributes {
    /// The audience of the token sent to the plugin.
    #[serde(default)]
    pub service_account_token_audience: String,
    /// `ServiceAccount` or `Token`.
    #[serde(default)]
    pub cache_type: String,
    /// Skip the plugin for pods without a service account name.
    #[serde(default)]
    pub require_service_account: Option<bool>,
    /// Annotations the service account must have (else no plugin call).
    #[serde(default)]
    pub required_service_account_annotation_keys: Vec<String>,
    /// Annotations passed along when present.
    #[serde(default)]
    pub optional_service_account_annotation_keys: Vec<String>,
}

/// A Go duration that may be negative (validation refuses it by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedDuration {
    /// The length.
    pub length: Duration,
    /// Below zero.
    pub negative: bool,
}

impl SignedDuration {
    /// Go's `time.Duration.String`.
    pub fn go_string(&self) -> String {
        let s = gofmt::duration(self.length);
        if self.negative && !self.length.is_zero() {
            format!("-{s}")
        } else {
            s
        }
    }
}

impl<'de> Deserialize<'de> for SignedDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let (negative, rest) = match text.trim().strip_prefix('-') {
            Some(r) => (true, r.to_string()),
            None => (false, text.clone()),
        };
        let length = keelson_common::duration::KubeDuration::parse(&rest)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "time: invalid duration {}: {e}",
                    gofmt::quote(&text)
                ))
            })?
            .get();
        Ok(SignedDuration { length, negative })
    }
}

/// What went wrong reading or validating the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The path is empty.
    #[error("credential provider config path is empty")]
    EmptyPath,
    /// The path cannot be inspected.
    #[error("unable to access path {}: {}", gofmt::quote(&.0.display().to_string()), gofmt::os_error_text(.1))]
    Access(PathBuf, std::io::Error),
    /// The directory cannot be listed.
    #[error("unable to read directory {}: {}", gofmt::quote(&.0.display().to_string()), gofmt::os_error_text(.1))]
    ReadDir(PathBuf, std::io::Error),
    /// The directory has no configuration file.
    #[error("no configuration files found in directory {}", gofmt::quote(&.0.display().to_string()))]
    NoFiles(PathBuf),
    /// A file cannot be read.
    #[error("unable to read file {}: {}", gofmt::quote(&.0.display().to_string()), gofmt::os_error_text(.1))]
    ReadFile(PathBuf, std::io::Error),
    /// A file is not a CredentialProviderConfig.
    #[error("error decoding config {}: {}", gofmt::quote(&.0.display().to_string()), .1)]
    Decode(PathBuf, String),
    /// Two files name the same provider.
    #[error("duplicate provider name {} found in configuration file(s)", gofmt::quote(.0))]
    DuplicateName(String),
    /// `validateCredentialProviderConfig` found errors.
    #[error("failed to validate credential provider config: {}", aggregate(.0))]
    Invalid(Vec<String>),
}

/// `utilerrors.NewAggregate(...).Error()`: one message alone, several in
/// brackets, duplicates once.
fn aggregate(errs: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errs {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// `readCredentialProviderConfig`: the merged configuration and its hash.
pub fn read(path: &Path) -> Result<(CredentialProviderConfig, String), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::EmptyPath);
    }
    let meta = std::fs::metadata(path).map_err(|e| ConfigError::Access(path.into(), e))?;
    let files = if meta.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| ConfigError::ReadDir(path.into(), e))?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ConfigError::NoFiles(path.into()));
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut merged = CredentialProviderConfig::default();
    let mut names: Vec<String> = Vec::new();
    for file in files {
        let data = std::fs::read(&file).map_err(|e| ConfigError::ReadFile(file.clone(), e))?;
        sha2::Digest::update(&mut hasher, (data.len() as u64).to_be_bytes());
        sha2::Digest::update(&mut hasher, &data);
        let config = decode(&data).map_err(|e| ConfigError::Decode(file.clone(), e))?;
        for p in config.providers {
            if names.contains(&p.name) {
                return Err(ConfigError::DuplicateName(p.name));
            }
            names.push(p.name.clone());
            merged.providers.push(p);
        }
    }
    let hash = format!("sha256:{}", hex::encode(sha2::Digest::finalize(hasher)));
    Ok((merged, hash))
}

/// `decode`: a strict decode of one document.
fn decode(data: &[u8]) -> Result<CredentialProviderConfig, String> {
    // Type first, so that a wrong kind is named before its fields.
    let value: serde_yaml::Value = serde_yaml::from_slice(data).map_err(|e| e.to_string())?;
    let get = |k: &str| {
        value
            .get(k)
            .and_then(serde_yaml::Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (get("apiVersion"), get("kind"));
    if api_version.is_empty() || kind.is_empty() {
        return Err(format!(
            "Object 'apiVersion' and 'Kind' are missing in {}",
            gofmt::quote(&String::from_utf8_lossy(data))
        ));
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    if kind != "CredentialProviderConfig" {
        return Err(format!(
            "failed to decode {} (wrong Kind)",
            gofmt::quote(&kind)
        ));
    }
    if group != GROUP {
        return Err(format!(
            "failed to decode CredentialProviderConfig, unexpected Group: {group}"
        ));
    }
    if !CONFIG_VERSIONS.contains(&version) {
        return Err(format!(
            "no kind {} is registered for version {} in scheme",
            gofmt::quote(&kind),
            gofmt::quote(&api_version)
        ));
    }
    serde_yaml::from_value(value).map_err(|e| format!("strict decoding error: {e}"))
}

/// Field error texts of `k8s.io/apimachinery/pkg/util/validation/field`.
mod field {
    use keelson_common::gofmt::quote;

    pub fn required(path: &str, detail: &str) -> String {
        with_detail(format!("{path}: Required value"), detail)
    }
    pub fn invalid(path: &str, value: &str, detail: &str) -> String {
        with_detail(format!("{path}: Invalid value: {value}"), detail)
    }
    pub fn duplicate(path: &str, value: &str) -> String {
        format!("{path}: Duplicate value: {}", quote(value))
    }
    pub fn forbidden(path: &str, detail: &str) -> String {
        with_detail(format!("{path}: Forbidden"), detail)
    }
    pub fn not_supported(path: &str, value: &str, valid: &[&str]) -> String {
        let list: Vec<String> = valid.iter().map(|v| quote(v)).collect();
        with_detail(
            format!("{path}: Unsupported value: {}", quote(value)),
            &format!("supported values: {}", list.join(", ")),
        )
    }
    fn with_detail(s: String, detail: &str) -> String {
        if detail.is_empty() {
            s
        } else {
            format!("{s}: {detail}")
        }
    }
}

/// `validateCredentialProviderConfig` (KubeletServiceAccountTokenForCredentialProviders
/// on, as by default in v1.36).
pub fn validate(config: &CredentialProviderConfig) -> Result<(), ConfigError> {
    use gofmt::quote;
    let mut errs = Vec::new();
    if config.providers.is_empty() {
        errs.push(field::required(
            "providers",
            "at least 1 item in plugins is required",
        ));
    }
    let mut seen: Vec<&str> = Vec::new();
    for p in &config.providers {
        let name = p.name.as_str();
        if name.contains('/') {
            errs.push(field::invalid(
                "providers.name",
                &quote(name),
                "provider name cannot contain '/'",
            ));
        }
        if name.contains(' ') {
            errs.push(field::invalid(
                "providers.name",
                &quote(name),
                "provider name cannot contain spaces",
            ));
        }
        if name == "." {
            errs.push(field::invalid(
                "providers.name",
                &quote(name),
                "provider name cannot be '.'",
            ));
        }
        if name == ".." {
            errs.push(field::invalid(
                "providers.name",
                &quote(name),
                "provider name cannot be '..'",
            ));
        }
        if seen.contains(&name) {
            errs.push(field::duplicate("providers.name", name));
        }
        seen.push(name);
        if p.api_version.is_empty() {
            errs.push(field::required("providers.apiVersion", ""));
        } else if !PROTOCOL_VERSIONS.contains(&p.api_version.as_str()) {
            let mut valid = PROTOCOL_VERSIONS.to_vec();
            valid.sort_unstable();
            errs.push(field::not_supported(
                "providers.apiVersion",
                &p.api_version,
                &valid,
            ));
        }
        if p.match_images.is_empty() {
            errs.push(field::required(
                "providers.matchImages",
                "at least 1 item in matchImages is required",
            ));
        }
        for m in &p.match_images {
            if let Err(e) = parse_schemeless(m) {
                errs.push(field::invalid(
                    "providers.matchImages",
                    &quote(m),
                    &format!("match image is invalid: {e}"),
                ));
            }
        }
        match &p.default_cache_duration {
            None => errs.push(field::required("providers.defaultCacheDuration", "")),
            Some(d) if d.negative && !d.length.is_zero() => errs.push(field::invalid(
                "providers.defaultCacheDuration",
                &quote(&d.go_string()),
                "must be greater than or equal to 0",
            )),
            Some(_) => {}
        }
        if let Some(t) = &p.token_attributes {
            validate_token_attributes(p, t, &mut errs);
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(errs))
    }
}

fn validate_token_attributes(p: &CredentialProvider, t: &TokenAttributes, errs: &mut Vec<String>) {
    const PATH: &str = "providers.tokenAttributes";
    if t.service_account_token_audience.is_empty() {
        errs.push(field::required(
            &format!("{PATH}.serviceAccountTokenAudience"),
            "",
        ));
    }
    if t.require_service_account.is_none() {
        errs.push(field::required(
            &format!("{PATH}.requireServiceAccount"),
            "",
        ));
    }
    if p.api_version != PROTOCOL_V1 {
        errs.push(field::forbidden(
            PATH,
            &format!("tokenAttributes is only supported for {PROTOCOL_V1} API version"),
        ));
    }
    if t.require_service_account == Some(false)
        && !t.required_service_account_annotation_keys.is_empty()
    {
        errs.push(field::forbidden(
            &format!("{PATH}.requiredServiceAccountAnnotationKeys"),
            "requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set",
        ));
    }
    annotation_keys(
        &format!("{PATH}.requiredServiceAccountAnnotationKeys"),
        &t.required_service_account_annotation_keys,
        errs,
    );
    annotation_keys(
        &format!("{PATH}.optionalServiceAccountAnnotationKeys"),
        &t.optional_service_account_annotation_keys,
        errs,
    );
    let mut both: Vec<&String> = t
        .required_service_account_annotation_keys
        .iter()
        .filter(|k| t.optional_service_account_annotation_keys.contains(k))
        .collect();
    both.sort();
    both.dedup();
    if !both.is_empty() {
        let json = serde_json::to_string(&both).unwrap_or_default();
        errs.push(field::invalid(
            PATH,
            &json,
            "annotation keys cannot be both required and optional",
        ));
    }
    if t.cache_type.is_empty() {
        errs.push(field::required(
            &format!("{PATH}.cacheType"),
            &format!(
                "cacheType is required to be set when tokenAttributes is specified. Supported values are: {}",
                CACHE_TYPES.join(", ")
            ),
        ));
    } else if !CACHE_TYPES.contains(&t.cache_type.as_str()) {
        errs.push(field::not_supported(
            &format!("{PATH}.cacheType"),
            &t.cache_type,
            CACHE_TYPES,
        ));
    }
}

/// `validateServiceAccountAnnotationKeys`.
fn annotation_keys(path: &str, keys: &[String], errs: &mut Vec<String>) {
    let mut seen: Vec<&str> = Vec::new();
    for k in keys {
        if let Err(reasons) = crate::downward::qualified_name(&k.to_lowercase()) {
            for r in reasons.0 {
                errs.push(field::invalid(path, &gofmt::quote(k), &r));
            }
        }
        if seen.contains(&k.as_str()) {
            errs.push(field::duplicate(path, k));
        }
        seen.push(k);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> CredentialProviderConfig {
        decode(yaml.as_bytes()).unwrap()
    }

    fn errors(yaml: &str) -> String {
        validate(&parse(yaml)).unwrap_err().to_string()
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n";

    #[test]
    fn a_valid_config_passes() {
        let c = parse(&format!(
            "{HEAD}providers:\n- name: ecr\n  matchImages: ['*.dkr.ecr.*.amazonaws.com', 'reg.io:5000/team']\n  defaultCacheDuration: 12h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials]\n  env: [{{name: A, value: b}}]\n"
        ));
        validate(&c).unwrap();
        assert_eq!(
            c.providers[0].default_cache_duration.unwrap().length,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(c.providers[0].env[0].name, "A");
    }

    #[test]
    fn kubelet_error_texts() {
        assert_eq!(
            errors(&format!("{HEAD}providers: []\n")),
            "failed to validate credential provider config: providers: Required value: at least 1 item in plugins is required"
        );
        assert_eq!(
            errors(&format!(
                "{HEAD}providers:\n- name: a/b\n  matchImages: ['foo bar']\n  defaultCacheDuration: -1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v2\n"
            )),
            "failed to validate credential provider config: [providers.name: Invalid value: \"a/b\": provider name cannot contain '/', \
providers.apiVersion: Unsupported value: \"credentialprovider.kubelet.k8s.io/v2\": supported values: \"credentialprovider.kubelet.k8s.io/v1\", \"credentialprovider.kubelet.k8s.io/v1alpha1\", \"credentialprovider.kubelet.k8s.io/v1beta1\", \
providers.matchImages: Invalid value: \"foo bar\": match image is invalid: parse \"https://foo bar\": invalid character \" \" in host name, \
providers.defaultCacheDuration: Invalid value: \"-1m0s\": must be greater than or equal to 0]"
        );
        assert_eq!(
            errors(&format!(
                "{HEAD}providers:\n- name: a\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
            )),
            "failed to validate credential provider config: [providers.matchImages: Required value: at least 1 item in matchImages is required, providers.defaultCacheDuration: Required value]"
        );
        assert!(errors(&format!("{HEAD}providers:\n- {{name: a, matchImages: [x], defaultCacheDuration: 1s, apiVersion: credentialprovider.kubelet.k8s.io/v1}}\n- {{name: a, matchImages: [x], defaultCacheDuration: 1s, apiVersion: credentialprovider.kubelet.k8s.io/v1}}\n"))
            .ends_with("providers.name: Duplicate value: \"a\""));
    }

    #[test]
    fn token_attributes_rules() {
        let e = errors(&format!(
            "{HEAD}providers:\n- name: a\n  matchImages: [x]\n  defaultCacheDuration: 1s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1beta1\n  tokenAttributes:\n    requireServiceAccount: false\n    requiredServiceAccountAnnotationKeys: [a.io/k, Bad_]\n    optionalServiceAccountAnnotationKeys: [a.io/k]\n"
        ));
        for part in [
            "providers.tokenAttributes.serviceAccountTokenAudience: Required value",
            "providers.tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version",
            "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set",
            "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Invalid value: \"Bad_\": name part must consist of",
            "providers.tokenAttributes: Invalid value: [\"a.io/k\"]: annotation keys cannot be both required and optional",
            "providers.tokenAttributes.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token",
        ] {
            assert!(e.contains(part), "{part}\nin\n{e}");
        }
        let e = errors(&format!(
            "{HEAD}providers:\n- name: a\n  matchImages: [x]\n  defaultCacheDuration: 1s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  tokenAttributes: {{serviceAccountTokenAudience: aud, requireServiceAccount: true, cacheType: Pod}}\n"
        ));
        assert!(e.ends_with("providers.tokenAttributes.cacheType: Unsupported value: \"Pod\": supported values: \"ServiceAccount\", \"Token\""), "{e}");
    }

    #[test]
    fn decoding_is_strict_and_typed() {
        assert!(
            decode(b"apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n")
                .unwrap_err()
                .contains("(wrong Kind)")
        );
        assert!(
            decode(b"apiVersion: other.io/v1\nkind: CredentialProviderConfig\n")
                .unwrap_err()
                .contains("unexpected Group: other.io")
        );
        assert!(
            decode(format!("{HEAD}providers:\n- name: a\n  matchImage: [x]\n").as_bytes())
                .unwrap_err()
                .contains("matchImage")
        );
    }

    #[test]
    fn a_directory_is_merged_in_order_and_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let one = format!(
            "{HEAD}providers:\n- {{name: b, matchImages: [x], defaultCacheDuration: 1s, apiVersion: credentialprovider.kubelet.k8s.io/v1}}\n"
        );
        let two = format!(
            "{HEAD}providers:\n- {{name: a, matchImages: [y], defaultCacheDuration: 1s, apiVersion: credentialprovider.kubelet.k8s.io/v1}}\n"
        );
        std::fs::write(dir.path().join("10-b.yaml"), &one).unwrap();
        std::fs::write(dir.path().join("20-a.json.yml"), &two).unwrap();
        std::fs::write(dir.path().join("README"), "not read").unwrap();
        let (c, hash) = read(dir.path()).unwrap();
        assert_eq!(
            c.providers
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["b", "a"]
        );
        let mut h = <sha2::Sha256 as sha2::Digest>::new();
        for d in [&one, &two] {
            sha2::Digest::update(&mut h, (d.len() as u64).to_be_bytes());
            sha2::Digest::update(&mut h, d.as_bytes());
        }
        assert_eq!(
            hash,
            format!("sha256:{}", hex::encode(sha2::Digest::finalize(h)))
        );
        std::fs::write(dir.path().join("30-dup.yaml"), &one).unwrap();
        assert_eq!(
            read(dir.path()).unwrap_err().to_string(),
            "duplicate provider name \"b\" found in configuration file(s)"
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(
            read(empty.path())
                .unwrap_err()
                .to_string()
                .starts_with("no configuration files found in directory")
        );
    }
}
