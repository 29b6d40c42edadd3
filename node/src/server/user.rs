//! Who a request to the node API comes from, as authentication (client
//! certificate or bearer token) found it and authorization reads it.

use std::collections::BTreeMap;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct User {
    /// User name.
    pub name: String,
    /// UID (tokens only).
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (tokens only).
    pub extra: BTreeMap<String, Vec<String>>,
}
