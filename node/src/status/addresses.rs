//! `status.addresses` as kubelet's NodeAddress setter
//! (pkg/kubelet/nodestatus/setters.go) sets them: the node IP (configured
//! and checked to be on a local interface, else the host name when it is
//! an IP, else the default route's source address) as `InternalIP`, and
//! the host name as `Hostname`. With an external cloud provider
//! (`cloudProvider: external`) the cloud controller manager owns the list:
//! the configured node IP goes to it in the
//! `alpha.kubernetes.io/provided-node-ip` annotation, and the list is only
//! set while it is empty (the node IP and host name, or only the host name
//! without a node IP) so the Node has addresses until the manager sets its
//! own.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};

/// The annotation carrying `--node-ip` to an external cloud controller
/// manager (cloud-provider's `AnnotationAlphaProvidedIPAddr`).
pub const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

/// Why no address list could be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// The configured node IP is not on this host.
    #[error("failed to validate nodeIP: node IP: {0:?} not found in the host's network interfaces")]
    NotLocal(String),
    /// No usable IP was found.
    #[error("can't get ip address of node {node}. error: {reason}")]
    NoAddress {
        /// The node name.
        node: String,
        /// Why.
        reason: String,
    },
}

/// Inputs of the NodeAddress setter.
#[derive(Debug, Clone)]
pub struct AddressInputs<'a> {
    /// The node's name, also its host name (`Hostname` address).
    pub hostname: &'a str,
    /// `nodeIP` from the configuration.
    pub configured_ip: Option<IpAddr>,
    /// Addresses of the host's interfaces (to validate `nodeIP`); `None`
    /// when they could not be listed (validation is then skipped).
    pub interface_addresses: Option<&'a [IpAddr]>,
    /// The default route's source address, when there is one.
    pub default_route_ip: Option<IpAddr>,
}

/// kubelet's NodeAddress setter on `node`: the provided-node-ip annotation
/// and `status.addresses`.
pub fn set_node_addresses(
    node: &mut Node,
    inputs: &AddressInputs<'_>,
    external_cloud_provider: bool,
) -> Result<(), AddressError> {
    let specified = inputs.configured_ip.filter(|ip| !ip.is_unspecified());
    if let (Some(ip), Some(local)) = (specified, inputs.interface_addresses)
        && !local.contains(&ip)
    {
        return Err(AddressError::NotLocal(ip.to_string()));
    }
    match specified {
        Some(ip) if external_cloud_provider => {
            node.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(PROVIDED_NODE_IP_ANNOTATION.to_string(), ip.to_string());
        }
        // No cloud provider, or no node IP to hand over: a stale one goes.
        _ => {
            if let Some(a) = node.metadata.annotations.as_mut() {
                a.remove(PROVIDED_NODE_IP_ANNOTATION);
            }
        }
    }
    let status = node.status.get_or_insert_with(NodeStatus::default);
    if external_cloud_provider {
        // The provider's addresses take precedence; the node's own are a
        // bootstrap until it sets them.
        if status.addresses.as_ref().is_some_and(|a| !a.is_empty()) {
            return Ok(());
        }
        if inputs.configured_ip.is_none() {
            status.addresses = Some(vec![NodeAddress {
                type_: "Hostname".to_string(),
                address: inputs.hostname.to_string(),
            }]);
            return Ok(());
        }
    }
    status.addresses = Some(node_addresses(inputs)?);
    Ok(())
}

/// Computes the address list.
pub fn node_addresses(inputs: &AddressInputs<'_>) -> Result<Vec<NodeAddress>, AddressError> {
    let ip = if let Some(ip) = inputs.configured_ip {
        if let Some(local) = inputs.interface_addresses
            && !local.contains(&ip)
        {
            return Err(AddressError::NotLocal(ip.to_string()));
        }
        ip
    } else if let Ok(ip) = inputs.hostname.parse::<IpAddr>() {
        ip
    } else {
        inputs
            .default_route_ip
            .ok_or_else(|| AddressError::NoAddress {
                node: inputs.hostname.to_string(),
                reason: "no default route with a usable source address".to_string(),
            })?
    };
    Ok(vec![
        NodeAddress {
            type_: "InternalIP".to_string(),
            address: ip.to_string(),
        },
        NodeAddress {
            type_: "Hostname".to_string(),
            address: inputs.hostname.to_string(),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn configured_ip_must_be_local() {
        let local = [ip("10.0.0.5"), ip("127.0.0.1")];
        let a = node_addresses(&AddressInputs {
            hostname: "n1",
            configured_ip: Some(ip("10.0.0.5")),
            interface_addresses: Some(&local),
            default_route_ip: Some(ip("192.168.1.2")),
        })
        .expect("addresses");
        assert_eq!(a[0].type_, "InternalIP");
        assert_eq!(a[0].address, "10.0.0.5");
        assert_eq!(a[1].type_, "Hostname");
        assert_eq!(a[1].address, "n1");

        let e = node_addresses(&AddressInputs {
            hostname: "n1",
            configured_ip: Some(ip("10.9.9.9")),
            interface_addresses: Some(&local),
            default_route_ip: None,
        })
        .expect_err("not local");
        assert_eq!(
            e.to_string(),
            "failed to validate nodeIP: node IP: \"10.9.9.9\" not found in the host's network interfaces"
        );
    }

    #[test]
    fn falls_back_to_hostname_ip_then_default_route() {
        let a = node_addresses(&AddressInputs {
            hostname: "10.1.1.1",
            configured_ip: None,
            interface_addresses: None,
            default_route_ip: Some(ip("192.168.1.2")),
        })
        .expect("addresses");
        assert_eq!(a[0].address, "10.1.1.1");
        let a = node_addresses(&AddressInputs {
            hostname: "n1",
            configured_ip: None,
            interface_addresses: None,
            default_route_ip: Some(ip("192.168.1.2")),
        })
        .expect("addresses");
        assert_eq!(a[0].address, "192.168.1.2");
        assert!(
            node_addresses(&AddressInputs {
                hostname: "n1",
                configured_ip: None,
                interface_addresses: None,
                default_route_ip: None,
            })
            .is_err()
        );
    }

    fn node_with(addresses: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.status = Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn addresses(n: &Node) -> Vec<(String, String)> {
        n.status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect()
    }

    fn annotation(n: &Node) -> Option<&str> {
        n.metadata
            .annotations
            .as_ref()?
            .get(PROVIDED_NODE_IP_ANNOTATION)
            .map(String::as_str)
    }

    #[test]
    fn an_external_cloud_provider_owns_the_addresses() {
        let local = [ip("10.0.0.5")];
        let with_ip = AddressInputs {
            hostname: "n1",
            configured_ip: Some(ip("10.0.0.5")),
            interface_addresses: Some(&local),
            default_route_ip: Some(ip("192.168.1.2")),
        };
        // A new Node: the node IP as a bootstrap address, and to the
        // provider in the annotation.
        let mut n = node_with(&[], &[]);
        set_node_addresses(&mut n, &with_ip, true).expect("set");
        assert_eq!(annotation(&n), Some("10.0.0.5"));
        assert_eq!(
            addresses(&n),
            [
                ("InternalIP".to_string(), "10.0.0.5".to_string()),
                ("Hostname".to_string(), "n1".to_string())
            ]
        );
        // The provider's addresses stay as it set them.
        let mut n = node_with(
            &[("InternalIP", "172.16.0.9"), ("ExternalIP", "203.0.113.7")],
            &[],
        );
        set_node_addresses(&mut n, &with_ip, true).expect("set");
        assert_eq!(
            addresses(&n)[1],
            ("ExternalIP".to_string(), "203.0.113.7".to_string())
        );
        assert_eq!(annotation(&n), Some("10.0.0.5"));
        // Without a node IP: only the host name, and no annotation.
        let without = AddressInputs {
            configured_ip: None,
            ..with_ip.clone()
        };
        let mut n = node_with(&[], &[(PROVIDED_NODE_IP_ANNOTATION, "10.0.0.5")]);
        set_node_addresses(&mut n, &without, true).expect("set");
        assert_eq!(annotation(&n), None);
        assert_eq!(addresses(&n), [("Hostname".to_string(), "n1".to_string())]);
        // Without a cloud provider the node's addresses win and a stale
        // annotation goes.
        let mut n = node_with(
            &[("InternalIP", "172.16.0.9")],
            &[(PROVIDED_NODE_IP_ANNOTATION, "1.2.3.4")],
        );
        set_node_addresses(&mut n, &with_ip, false).expect("set");
        assert_eq!(annotation(&n), None);
        assert_eq!(
            addresses(&n)[0],
            ("InternalIP".to_string(), "10.0.0.5".to_string())
        );
        // A node IP that is not local fails before anything is set.
        let mut n = node_with(&[], &[]);
        let foreign = AddressInputs {
            configured_ip: Some(ip("10.9.9.9")),
            ..with_ip
        };
        assert!(set_node_addresses(&mut n, &foreign, true).is_err());
        assert_eq!(annotation(&n), None);
    }
}
