//! The resource types the API server double serves.

/// One served resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceType {
    /// API group (`""` for core).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name.
    pub resource: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Subresources served.
    pub subresources: &'static [&'static str],
    /// Whether the main resource ignores `.status` (status subresource semantics).
    pub has_status: bool,
    /// Whether an update without `metadata.resourceVersion` is accepted.
    pub unconditional_update: bool,
    /// Create-only virtual resources (TokenReview).
    pub create_only: bool,
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `nodesets.slinky.slurm.net`, as in error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

const ALL_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

macro_rules! rt {
    ($g:expr, $v:expr, $r:expr, $s:expr, $k:expr, $ns:expr, $sub:expr, $status:expr, $uncond:expr) => {
        ResourceType {
            group: $g,
            version: $v,
            resource: $r,
            singular: $s,
            kind: $k,
            namespaced: $ns,
            subresources: $sub,
            has_status: $status,
            unconditional_update: $uncond,
            create_only: false,
        }
    };
}

/// Core v1 pods.
pub const PODS: ResourceType = rt!(
    "",
    "v1",
    "pods",
    "pod",
    "Pod",
    true,
    &["status", "eviction"],
    true,
    true
);
/// Core v1 secrets.
pub const SECRETS: ResourceType = rt!(
    "",
    "v1",
    "secrets",
    "secret",
    "Secret",
    true,
    &[],
    false,
    true
);
/// Core v1 configmaps.
pub const CONFIGMAPS: ResourceType = rt!(
    "",
    "v1",
    "configmaps",
    "configmap",
    "ConfigMap",
    true,
    &[],
    false,
    true
);
/// Core v1 nodes.
pub const NODES: ResourceType = rt!(
    "",
    "v1",
    "nodes",
    "node",
    "Node",
    false,
    &["status"],
    true,
    true
);
/// Core v1 namespaces.
pub const NAMESPACES: ResourceType = rt!(
    "",
    "v1",
    "namespaces",
    "namespace",
    "Namespace",
    false,
    &["status"],
    true,
    true
);
/// Core v1 events.
pub const CORE_EVENTS: ResourceType =
    rt!("", "v1", "events", "event", "Event", true, &[], false, true);
/// Core v1 service accounts.
pub const SERVICE_ACCOUNTS: ResourceType = rt!(
    "",
    "v1",
    "serviceaccounts",
    "serviceaccount",
    "ServiceAccount",
    true,
    &[],
    false,
    true
);
/// Core v1 services (only stored, and proxied: see `proxy.rs`).
pub const SERVICES: ResourceType = rt!(
    "",
    "v1",
    "services",
    "service",
    "Service",
    true,
    &["proxy"],
    false,
    true
);
/// Core v1 endpoints (only stored; the service proxy reads them).
pub const ENDPOINTS: ResourceType = rt!(
    "",
    "v1",
    "endpoints",
    "endpoints",
    "Endpoints",
    true,
    &[],
    false,
    true
);
/// events.k8s.io/v1 events.
pub const EVENTS: ResourceType = rt!(
    "events.k8s.io",
    "v1",
    "events",
    "event",
    "Event",
    true,
    &[],
    false,
    true
);
/// policy/v1 poddisruptionbudgets.
pub const PDBS: ResourceType = rt!(
    "policy",
    "v1",
    "poddisruptionbudgets",
    "poddisruptionbudget",
    "PodDisruptionBudget",
    true,
    &["status"],
    true,
    true
);
/// coordination.k8s.io/v1 leases.
pub const LEASES: ResourceType = rt!(
    "coordination.k8s.io",
    "v1",
    "leases",
    "lease",
    "Lease",
    true,
    &[],
    false,
    true
);
/// slinky.slurm.net/v1beta1 nodesets (custom resource: updates need a resourceVersion).
pub const NODESETS: ResourceType = rt!(
    "slinky.slurm.net",
    "v1beta1",
    "nodesets",
    "nodeset",
    "NodeSet",
    true,
    &["status"],
    true,
    false
);
/// apps/v1 daemonsets (stored objects only: no pods are created from them).
pub const DAEMONSETS: ResourceType = rt!(
    "apps",
    "v1",
    "daemonsets",
    "daemonset",
    "DaemonSet",
    true,
    &["status"],
    true,
    true
);
/// authentication.k8s.io/v1 tokenreviews (create only).
pub const TOKEN_REVIEWS: ResourceType = ResourceType {
    create_only: true,
    ..rt!(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
        false,
        &[],
        false,
        true
    )
};

/// authorization.k8s.io/v1 subjectaccessreviews (create only).
pub const SUBJECT_ACCESS_REVIEWS: ResourceType = ResourceType {
    create_only: true,
    ..rt!(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
        false,
        &[],
        false,
        true
    )
};

/// Every served type.
pub const ALL: &[ResourceType] = &[
    PODS,
    SECRETS,
    CONFIGMAPS,
    NODES,
    NAMESPACES,
    CORE_EVENTS,
    SERVICE_ACCOUNTS,
    SERVICES,
    ENDPOINTS,
    EVENTS,
    PDBS,
    LEASES,
    NODESETS,
    DAEMONSETS,
    TOKEN_REVIEWS,
    SUBJECT_ACCESS_REVIEWS,
];

/// Finds a type by group, version and plural.
pub fn find(group: &str, version: &str, resource: &str) -> Option<ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.resource == resource)
}

/// Every served group version (`v1` first).
pub fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in ALL {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// The `APIResourceList` for one group version.
pub fn resource_list(group: &str, version: &str) -> serde_json::Value {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for r in ALL
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs: &[&str] = if r.create_only {
            &["create"]
        } else {
            ALL_VERBS
        };
        resources.push(serde_json::json!({
            "name": r.resource,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
        }));
        for sub in r.subresources {
            let (kind, group, version, verbs): (&str, &str, &str, &[&str]) = match *sub {
                "eviction" => ("Eviction", "policy", "v1", &["create"]),
                "proxy" => (
                    "ServiceProxyOptions",
                    "",
                    "v1",
                    &["create", "delete", "get", "patch", "update"],
                ),
                _ => (r.kind, r.group, r.version, &["get", "patch", "update"]),
            };
            resources.push(serde_json::json!({
                "name": format!("{}/{}", r.resource, sub),
                "singularName": "",
                "namespaced": r.namespaced,
                "group": group,
                "version": version,
                "kind": kind,
                "verbs": verbs,
            }));
        }
    }
    serde_json::json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    })
}
