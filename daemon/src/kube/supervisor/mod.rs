//! The supervisor: a `Tinkerbell` resource (`tinkerbox.io/v1alpha1`) says
//! which Tink and Rufio the cluster runs, and the kube-mode leader makes it
//! so and keeps it so (tinkerbox serves Smee and Hegel itself).
//!
//! - `release`: the releases tinkerbox knows (images, flags or env, RBAC,
//!   the Workflow schema each expects).
//! - `spec`: the resource's spec checked into a [`spec::Plan`], or the
//!   [`spec::Refusal`] its condition shows.
//! - `desired`: the objects a plan means (a chart's worth), and the
//!   components' health from their Deployments; pure.
//! - `migrate`: tink v0.12 Workflows to the current shape; pure.
//! - `run`: the controller that applies, repairs, prunes, migrates, writes
//!   status and events, and cleans up behind a finalizer; and the watch
//!   every instance runs for the gRPC address agents are given.
//! - `view`: `tinkerbox kube status`.

pub mod desired;
pub mod migrate;
pub mod release;
pub mod run;
pub mod spec;
pub mod view;

use serde::Serialize;

pub const GROUP: &str = "tinkerbox.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "Tinkerbell";
pub const PLURAL: &str = "tinkerbells";
/// Held on the resource until what it made outside its namespace (and,
/// if asked, the CRDs) is gone.
pub const FINALIZER: &str = "tinkerbox.io/supervisor";
/// On every object the supervisor makes: which resource made it (label
/// values, so that a list can select them).
pub const OWNER_NAMESPACE: &str = "tinkerbox.io/owner-namespace";
pub const OWNER_NAME: &str = "tinkerbox.io/owner-name";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// A supervised component: one Deployment each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    TinkServer,
    TinkController,
    Rufio,
}

impl Component {
    pub const ALL: [Component; 3] = [
        Component::TinkServer,
        Component::TinkController,
        Component::Rufio,
    ];

    /// Its Deployment's (and ServiceAccount's) name.
    pub fn name(self) -> &'static str {
        match self {
            Component::TinkServer => "tink-server",
            Component::TinkController => "tink-controller",
            Component::Rufio => "rufio",
        }
    }

    pub fn from_name(s: &str) -> Option<Component> {
        Component::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Its key under `spec`.
    pub fn spec_field(self) -> &'static str {
        match self {
            Component::TinkServer => "tinkServer",
            Component::TinkController => "tinkController",
            Component::Rufio => "rufio",
        }
    }

    /// The `[kube]` key saying who plays its role.
    pub fn role_key(self) -> &'static str {
        match self {
            Component::TinkServer | Component::TinkController => "tink",
            Component::Rufio => "rufio",
        }
    }

    pub fn runs(self) -> &'static str {
        match self {
            Component::TinkServer | Component::TinkController => "the Workflows",
            Component::Rufio => "the BMC Machines, Jobs and Tasks",
        }
    }

    /// Controllers elect a leader (and need a Lease to).
    pub fn elects(self) -> bool {
        self != Component::TinkServer
    }
}

/// The `Tinkerbell` resource the objects belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
