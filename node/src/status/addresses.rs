//! `status.addresses` without a cloud provider, as kubelet's NodeAddress
//! setter computes them: the node IP (configured and checked to be on a
//! local interface, else the host name when it is an IP, else the default
//! route's source address) as `InternalIP`, and the host name as `Hostname`.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::NodeAddress;

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
}
