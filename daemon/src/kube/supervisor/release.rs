//! The Tinkerbell releases the supervisor knows how to run: images, how
//! each component is configured (flags or `TINKERBELL_*` environment), its
//! ports, probes and RBAC, and the shape of the Workflow objects it expects.
//! A new release is one more row in [`RELEASES`].

use super::Component;
use crate::kube::convert::WorkflowSchema;
use crate::kube::crds::FILES;

/// How a release packages its components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// tink v0.12 and Rufio v0.6: one image per component, configured by
    /// flags.
    Split,
    /// tinkerbell/tinkerbell: one image for everything, each service
    /// switched on by `TINKERBELL_ENABLE_*`; tinkerbox runs it once per
    /// component with only that one enabled.
    Single,
}

#[derive(Debug)]
pub struct Release {
    pub version: &'static str,
    pub profile: Profile,
    /// Default images, by component: `registry/repository:tag`.
    pub images: [(Component, &'static str); 3],
    /// The Workflow CRD's status schema (what a migration converts).
    pub workflows: WorkflowSchema,
    /// The CRD files of this release (`daemon/crds/`: name, contents),
    /// applied before the Deployments.
    pub crds: &'static [(&'static str, &'static str)],
}

/// Upstream's current CRDs: what `kube install-crds` applies, but
/// tinkerbox's own.
const CURRENT_CRDS: [(&str, &str); 6] =
    [FILES[0], FILES[1], FILES[2], FILES[3], FILES[4], FILES[5]];

/// tink v0.12's Workflow CRD (`STATE_*`, `worker`, `templateRending`); the
/// other kinds' current CRDs accept everything v0.12 writes (they only
/// gained optional fields), so they are shared.
const V012_CRDS: [(&str, &str); 6] = [
    CURRENT_CRDS[0],
    CURRENT_CRDS[1],
    (
        "v0.12/tinkerbell.org_workflows.yaml",
        include_str!("../../../crds/v0.12/tinkerbell.org_workflows.yaml"),
    ),
    CURRENT_CRDS[3],
    CURRENT_CRDS[4],
    CURRENT_CRDS[5],
];

/// Oldest first; the last is what an empty `spec.version` means.
pub const RELEASES: [Release; 2] = [
    Release {
        version: "v0.12.2",
        profile: Profile::Split,
        images: [
            (Component::TinkServer, "quay.io/tinkerbell/tink:v0.12.2"),
            (
                Component::TinkController,
                "quay.io/tinkerbell/tink-controller:v0.12.2",
            ),
            (Component::Rufio, "quay.io/tinkerbell/rufio:v0.6.3"),
        ],
        workflows: WorkflowSchema::V012,
        crds: &V012_CRDS,
    },
    Release {
        version: "v0.25.0",
        profile: Profile::Single,
        images: [
            (
                Component::TinkServer,
                "ghcr.io/tinkerbell/tinkerbell:v0.25.0",
            ),
            (
                Component::TinkController,
                "ghcr.io/tinkerbell/tinkerbell:v0.25.0",
            ),
            (Component::Rufio, "ghcr.io/tinkerbell/tinkerbell:v0.25.0"),
        ],
        workflows: WorkflowSchema::Current,
        crds: &CURRENT_CRDS,
    },
];

/// A release by its version ("v0.25.0"; the "v" may be left out); empty:
/// the newest.
pub fn find(version: &str) -> Option<&'static Release> {
    let v = version.trim();
    if v.is_empty() {
        return RELEASES.last();
    }
    let v = v.strip_prefix('v').unwrap_or(v);
    RELEASES.iter().find(|r| &r.version[1..] == v)
}

/// The known versions, for an error message.
pub fn known() -> String {
    RELEASES
        .iter()
        .map(|r| r.version)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Release {
    pub fn image(&self, c: Component) -> &'static str {
        self.images
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, i)| *i)
            .unwrap_or_default()
    }

    /// Where this release sits among the known ones (newer is larger).
    pub fn rank(&self) -> usize {
        RELEASES
            .iter()
            .position(|r| r.version == self.version)
            .unwrap_or(0)
    }
}

/// A component's container port that matters: tink-server's gRPC.
pub const GRPC_PORT: i32 = 42113;

/// One `rbac.authorization.k8s.io/v1` rule: API groups, resources, verbs.
pub type Rule = (
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["get", "list", "watch", "patch", "update"];
const CREATE_WRITE: &[&str] = &["create", "get", "list", "watch", "patch", "update"];
const ALL: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// What each component may do in the namespaces it watches (the charts'
/// rules, the same in both profiles: the single image's ClusterRole is
/// their union).
pub fn rules(c: Component) -> &'static [Rule] {
    match c {
        // The current tink-server also creates Hardware and Workflows (agent
        // enrolment) and reads WorkflowRuleSets.
        Component::TinkServer => &[
            (
                &["tinkerbell.org"],
                &["hardware", "hardware/status"],
                CREATE_WRITE,
            ),
            (
                &["tinkerbell.org"],
                &["templates", "templates/status"],
                READ,
            ),
            (
                &["tinkerbell.org"],
                &["workflows", "workflows/status"],
                CREATE_WRITE,
            ),
            (&["tinkerbell.org"], &["workflowrulesets"], READ),
        ],
        Component::TinkController => &[
            (
                &["bmc.tinkerbell.org"],
                &["jobs", "jobs/status"],
                &["create", "delete", "get", "list", "watch"],
            ),
            (&["tinkerbell.org"], &["hardware", "hardware/status"], WRITE),
            (
                &["tinkerbell.org"],
                &["templates", "templates/status"],
                WRITE,
            ),
            (
                &["tinkerbell.org"],
                &["workflows", "workflows/status"],
                &["delete", "get", "list", "patch", "update", "watch"],
            ),
        ],
        Component::Rufio => &[
            (
                &["bmc.tinkerbell.org"],
                &[
                    "machines",
                    "machines/status",
                    "machines/finalizers",
                    "jobs",
                    "jobs/status",
                    "jobs/finalizers",
                    "tasks",
                    "tasks/status",
                    "tasks/finalizers",
                ],
                ALL,
            ),
            (&[""], &["secrets"], READ),
        ],
    }
}

/// Leader election (in the component's own namespace): controllers only.
pub const LEADER_RULES: &[Rule] = &[
    (&[""], &["configmaps"], ALL),
    (&["coordination.k8s.io"], &["leases"], ALL),
    (&[""], &["events"], &["create", "patch"]),
    (&["events.k8s.io"], &["events"], &["create", "patch"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_release_has_its_crds_and_images() {
        for r in &RELEASES {
            let names: Vec<String> = r
                .crds
                .iter()
                .map(|(f, y)| crate::kube::crds::parse(f, y).unwrap().name)
                .collect();
            assert!(
                names.contains(&"workflows.tinkerbell.org".to_string()),
                "{}",
                r.version
            );
            assert_eq!(names.len(), 6, "{}", r.version);
            for c in Component::ALL {
                assert!(r.image(c).ends_with(
                    if c == Component::Rufio && r.profile == Profile::Split {
                        "v0.6.3"
                    } else {
                        r.version
                    }
                ));
            }
        }
        let v012 = find("0.12.2").unwrap();
        let wf = crate::kube::crds::parse(v012.crds[2].0, v012.crds[2].1).unwrap();
        assert_eq!(WorkflowSchema::of_crd(&wf.doc), WorkflowSchema::V012);
        assert_eq!(find("").unwrap().version, "v0.25.0");
        assert!(find("v0.13").is_none());
    }
}
