//! The conformance tests that cannot run on this machine, for either agent,
//! each with its reason. Only what the environment lacks belongs here (no
//! registry, no image that can be built from what is here, no cloud, an
//! API server build without OpenAPI — probed when the cluster starts): a
//! test that fails because an agent behaves differently is a bug to fix,
//! never an entry of this list. `scripts/conformance` leaves them out of
//! both runs and docs/conformance.md prints the reason beside each.

use serde::{Deserialize, Serialize};

/// A test left out of runs on a cluster where `when` holds.
#[derive(Debug, Clone, Copy)]
pub struct EnvironmentSkip {
    /// The test's full name, exactly as the suite prints it.
    pub name: &'static str,
    /// Why it cannot run here.
    pub reason: &'static str,
    /// On which clusters.
    pub when: When,
}

/// When an [`EnvironmentSkip`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// On every cluster of this machine.
    Always,
    /// When the API server serves no OpenAPI v2 document
    /// ([`Environment::openapi_broken`]).
    OpenApiBroken,
}

/// What the cluster of a run lacks, found when it starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Environment {
    /// `GET /openapi/v2` answered 503 for as long as the cluster waited.
    pub openapi_broken: bool,
}

const BROKEN_OPENAPI: &str = "this machine's kube-apiserver v1.36.2 serves no OpenAPI document (its /openapi/v2 answers 503 Service Unavailable, /openapi/v3 carries raw Go struct fields such as OperationProps; its log shows 'has invalid properties: ArbitraryKeys, SchemaProps, SwaggerSchemaProps'): the shared binary was built with Go 1.27, whose default GOEXPERIMENT=jsonv2 breaks kube-openapi's vendored JSON library, so kubectl's client-side validation, OpenAPI publishing of CRDs and MutatingAdmissionPolicy's typed patches fail on any node agent; a kube-apiserver built with GOEXPERIMENT=nojsonv2 runs them";

const SKIPS: &[EnvironmentSkip] = &[
    EnvironmentSkip {
        name: "[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current Aggregator [LinuxOnly] [Conformance]",
        reason: "needs the sample-apiserver image (registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2): no registry is reachable and its binary is not among the shared binaries, so it cannot be built here",
        when: When::Always,
    },
    EnvironmentSkip {
        name: "[sig-node] ImageVolume should succeed with pod and pull policy of Always [LinuxOnly] [MinimumKubeletVersion:1.35] [Conformance]",
        reason: "pulls its image volume with pull policy Always from a registry, and none is reachable here",
        when: When::Always,
    },
    EnvironmentSkip {
        name: "[sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD preserving unknown fields at the schema root [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD preserving unknown fields in an embedded object [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD with validation schema [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD without validation schema [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-api-machinery] MutatingAdmissionPolicy [Privileged:ClusterAdmin] should mutate a Deployment [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-api-machinery] MutatingAdmissionPolicy [Privileged:ClusterAdmin] should mutate a Deployment with annotations [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Guestbook application should create and stop a working application [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Kubectl describe should check if kubectl describe prints relevant information for rc and pods [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Kubectl diff should check if kubectl diff finds a difference for Deployments [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Kubectl expose should create services for rc [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Kubectl label should update the label on a resource [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Kubectl patch should add annotations for pods in rc [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Kubectl replace should update a single-container pod's image [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Update Demo should create and stop a replication controller [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
    EnvironmentSkip {
        name: "[sig-cli] Kubectl client Update Demo should scale a replication controller [Conformance]",
        reason: BROKEN_OPENAPI,
        when: When::OpenApiBroken,
    },
];

/// The skips that apply on a cluster with `env`.
pub fn environment_skips(env: &Environment) -> impl Iterator<Item = &'static EnvironmentSkip> {
    let env = *env;
    SKIPS.iter().filter(move |s| match s.when {
        When::Always => true,
        When::OpenApiBroken => env.openapi_broken,
    })
}

/// The reason `name` is skipped on a cluster with `env`, if it is.
pub fn reason(name: &str, env: &Environment) -> Option<&'static str> {
    environment_skips(env)
        .find(|s| s.name == name)
        .map(|s| s.reason)
}

/// Why `name` fails on every agent of a cluster that lacks something,
/// whether or not its run left it out: explains a record made before the
/// skip existed, or on a cluster where the probe did not see the lack.
pub fn known_cause(name: &str) -> Option<&'static str> {
    SKIPS
        .iter()
        .find(|s| s.name == name && s.when != When::Always)
        .map(|s| s.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_skip_names_a_conformance_test_and_says_why() {
        let broken = Environment {
            openapi_broken: true,
        };
        for s in environment_skips(&broken) {
            assert!(s.name.ends_with("[Conformance]"), "{}", s.name);
            assert!(s.reason.len() > 20, "{}: reason too short", s.name);
            assert_eq!(reason(s.name, &broken), Some(s.reason));
        }
        assert_eq!(reason("[sig-node] not a test", &broken), None);
    }

    #[test]
    fn openapi_skips_apply_only_where_the_api_server_lacks_openapi() {
        let name = "[sig-cli] Kubectl client Kubectl label should update the label on a resource [Conformance]";
        let working = Environment::default();
        assert_eq!(reason(name, &working), None);
        assert!(
            reason(
                name,
                &Environment {
                    openapi_broken: true
                }
            )
            .is_some()
        );
        assert_eq!(
            environment_skips(&working).count(),
            SKIPS.iter().filter(|s| s.when == When::Always).count()
        );
    }
}
