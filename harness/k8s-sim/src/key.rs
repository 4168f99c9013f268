//! How the store names an object.

/// An object's key: resource (plural), namespace ("" for cluster-scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// Plural resource (`pods`).
    pub resource: String,
    /// Namespace, or "".
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Key {
    /// A key.
    pub fn new(resource: &str, namespace: &str, name: &str) -> Self {
        Self {
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}
