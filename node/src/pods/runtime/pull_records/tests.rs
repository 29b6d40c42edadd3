use super::*;

fn secret(name: &str, hash: &str) -> PullSecret {
    PullSecret {
        uid: format!("uid-{name}"),
        namespace: "ns".into(),
        name: name.into(),
        credential_hash: hash.into(),
    }
}

fn manager(dir: &Path, policy: VerificationPolicy) -> PullManager {
    PullManager::new(dir, policy, None)
}

#[test]
fn trims_tags_and_digests_as_written() {
    assert_eq!(trim_tag_digest("busybox").unwrap(), "busybox");
    assert_eq!(trim_tag_digest("busybox:1").unwrap(), "busybox");
    assert_eq!(
        trim_tag_digest("reg.example:5000/team/app:v2@sha256:abcd").unwrap(),
        "reg.example:5000/team/app"
    );
    assert_eq!(
        trim_tag_digest("reg.example:5000/team/app").unwrap(),
        "reg.example:5000/team/app"
    );
    assert!(trim_tag_digest("Busybox").is_err());
    assert!(trim_tag_digest("").is_err());
}

#[test]
fn allowlist_patterns_as_kubelet_validates_them() {
    let l = Allowlist::new(&[
        "reg.example/team/*".into(),
        "docker.io/library/busybox".into(),
    ])
    .unwrap();
    assert!(l.matches("reg.example/team/app:1"));
    assert!(l.matches("docker.io/library/busybox:1.36"));
    assert!(!l.matches("reg.example/other/app"));
    assert!(Allowlist::new(&["reg.example/*/x".into()]).is_err());
    assert!(Allowlist::new(&["busybox:1".into()]).is_err());
    assert!(Allowlist::new(&[" busybox".into()]).is_err());
    assert!(Allowlist::new(&["/*".into()]).is_err());
}

#[test]
fn preloaded_images_need_no_credentials_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), VerificationPolicy::NeverVerifyPreloadedImages);
    assert!(!m.must_attempt_pull("busybox:1", "sha256:aa", &[]));
    let always = manager(dir.path(), VerificationPolicy::AlwaysVerify);
    assert!(always.must_attempt_pull("busybox:1", "sha256:aa", &[]));
    let never = manager(dir.path(), VerificationPolicy::NeverVerify);
    assert!(!never.must_attempt_pull("busybox:1", "sha256:aa", &[]));
}

#[test]
fn an_image_pulled_with_a_secret_needs_that_secret_or_its_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), VerificationPolicy::NeverVerifyPreloadedImages);
    let image = "reg.example/team/app:1";
    m.record_pull_intent(image).unwrap();
    assert!(
        dir.path()
            .join("image_manager/pulling")
            .read_dir()
            .unwrap()
            .count()
            == 1,
        "the intent is on disk while the pull runs"
    );
    m.record_image_pulled(
        image,
        "sha256:bb",
        &PullCredentials::used(Some(secret("a", "h1"))),
    );
    assert_eq!(
        dir.path()
            .join("image_manager/pulling")
            .read_dir()
            .unwrap()
            .count(),
        0
    );
    // No secret, another secret with other credentials: pull.
    assert!(m.must_attempt_pull(image, "sha256:bb", &[]));
    assert!(m.must_attempt_pull(image, "sha256:bb", &[secret("b", "h2")]));
    // The same secret, or another one holding the same credentials: no pull,
    // and the second is remembered.
    assert!(!m.must_attempt_pull(image, "sha256:bb", &[secret("a", "h1")]));
    assert!(!m.must_attempt_pull("reg.example/team/app:2", "sha256:bb", &[secret("c", "h1")]));
    let rec = m.read_pulled("sha256:bb").unwrap().unwrap();
    let names: Vec<&str> = rec.credential_mapping["reg.example/team/app"]
        .kubernetes_secrets
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, vec!["a", "c"]);
    // Another image name for the same id has no record: verify.
    assert!(m.must_attempt_pull(
        "reg.example/mirror/app:1",
        "sha256:bb",
        &[secret("a", "h1")]
    ));
}

#[test]
fn an_anonymous_pull_opens_the_image_to_every_pod() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), VerificationPolicy::AlwaysVerify);
    m.record_pull_intent("busybox:1").unwrap();
    m.record_image_pulled(
        "busybox:1",
        "sha256:cc",
        &PullCredentials::used(Some(secret("a", "h1"))),
    );
    m.record_pull_intent("busybox:1").unwrap();
    m.record_image_pulled("busybox:1", "sha256:cc", &PullCredentials::used(None));
    assert!(!m.must_attempt_pull("busybox:1", "sha256:cc", &[]));
    let rec = m.read_pulled("sha256:cc").unwrap().unwrap();
    assert_eq!(
        rec.credential_mapping["busybox"],
        PullCredentials {
            node_pods_accessible: true,
            ..Default::default()
        }
    );
}

#[test]
fn a_pull_in_flight_counts_as_pulled_by_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), VerificationPolicy::NeverVerifyPreloadedImages);
    m.record_pull_intent("busybox:1").unwrap();
    assert!(m.must_attempt_pull("busybox:1", "sha256:dd", &[]));
    m.record_image_pull_failed("busybox:1");
    assert!(!m.must_attempt_pull("busybox:1", "sha256:dd", &[]));
}

#[test]
fn an_intent_left_by_a_crash_becomes_a_record_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    {
        let m = manager(dir.path(), VerificationPolicy::NeverVerifyPreloadedImages);
        m.record_pull_intent("reg.example/app:1").unwrap();
    }
    let m = manager(dir.path(), VerificationPolicy::NeverVerifyPreloadedImages);
    assert_eq!(m.leftover_intents(), vec!["reg.example/app:1".to_string()]);
    m.initialize(&[(
        "sha256:ee".to_string(),
        vec!["reg.example/app:1".to_string()],
    )]);
    assert!(m.leftover_intents().is_empty());
    // Pulled by the node, with no credentials known: a pod must pull.
    assert!(m.must_attempt_pull("reg.example/app:1", "sha256:ee", &[]));
    let rec = m.read_pulled("sha256:ee").unwrap().unwrap();
    assert!(rec.credential_mapping.is_empty());
}

#[test]
fn records_are_written_as_kubelet_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), VerificationPolicy::NeverVerifyPreloadedImages);
    m.record_pull_intent("busybox:1").unwrap();
    m.record_image_pulled(
        "busybox:1",
        "sha256:ff",
        &PullCredentials::used(Some(secret("a", "h1"))),
    );
    let path = dir
        .path()
        .join("image_manager/pulled")
        .join(format!("sha256-{:x}", Sha256::digest(b"sha256:ff")));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(v["apiVersion"], "kubelet.config.k8s.io/v1beta1");
    assert_eq!(v["kind"], "ImagePulledRecord");
    assert_eq!(v["imageRef"], "sha256:ff");
    assert_eq!(
        v["credentialMapping"]["busybox"]["kubernetesSecrets"][0],
        serde_json::json!({"uid": "uid-a", "namespace": "ns", "name": "a", "credentialHash": "h1"})
    );
}
