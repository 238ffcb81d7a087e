//! A `Tinkerbell` resource's spec, read and checked: what to run, or why
//! nothing will change ([`Refusal`], which becomes a condition).

use super::release::{self, Release};
use super::{Component, Owner};
use crate::config::Role;
use crate::kube::rbac::dns_label;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `spec`, as the CRD has it (unknown keys are refused: a typo must not be
/// silently a default).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Spec {
    pub version: String,
    pub namespace: String,
    pub scope: Scope,
    pub registry: String,
    pub image_pull_secrets: Vec<String>,
    #[serde(rename = "publicIP")]
    pub public_ip: String,
    pub crds: CrdPolicy,
    pub tink_server: ComponentSpec,
    pub tink_controller: ComponentSpec,
    pub rufio: ComponentSpec,
}

/// Where the components look for objects, and so which RBAC they get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum Scope {
    /// Every namespace: ClusterRoles (upstream's default).
    #[default]
    #[serde(alias = "")]
    Cluster,
    /// Only `spec.namespace`: Roles there.
    Namespace,
}

/// The CRDs' fate when the resource is deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum CrdPolicy {
    /// Keep them, and with them every Hardware, Template, Workflow and BMC
    /// object.
    #[default]
    #[serde(alias = "")]
    Keep,
    /// Delete them: the API server then deletes every object of theirs.
    Delete,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ComponentSpec {
    /// Unset: on exactly when tinkerbox's `[kube]` role for it is
    /// `external` (tinkerbox does not run what it runs itself).
    pub enabled: Option<bool>,
    pub image: Option<String>,
    pub replicas: Option<i32>,
    /// A container's `resources` as Kubernetes takes it.
    pub resources: Option<Value>,
    /// Appended to the release's own arguments.
    pub args: Vec<String>,
    /// Container `env` entries; one named like a release default replaces it.
    pub env: Vec<Value>,
    /// tink-server only: the Service type (default LoadBalancer, as upstream).
    pub service_type: Option<ServiceType>,
    /// tink-server only.
    pub tls: Option<Tls>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum ServiceType {
    ClusterIP,
    NodePort,
    LoadBalancer,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Tls {
    /// A `kubernetes.io/tls` Secret in the components' namespace.
    pub secret_name: String,
}

/// What tinkerbox runs itself (`[kube] tink`/`rufio`).
pub use crate::kube::rbac::Roles;

fn role_of(roles: Roles, c: Component) -> Role {
    match c {
        Component::TinkServer | Component::TinkController => roles.tink,
        Component::Rufio => roles.rufio,
    }
}

/// A spec that can be run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub owner: Owner,
    pub release: &'static Release,
    /// Where the components run.
    pub namespace: String,
    pub scope: Scope,
    pub registry: String,
    pub image_pull_secrets: Vec<String>,
    pub public_ip: Option<std::net::IpAddr>,
    pub crds: CrdPolicy,
    /// The enabled components, in order.
    pub components: Vec<(Component, ComponentSpec)>,
}

/// Why a spec changes nothing: the condition's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a spec tinkerbox can read.
    InvalidSpec(String),
    UnknownVersion(String),
    /// Settings that contradict each other or tinkerbox's own config.
    Conflict(String),
    /// Another `Tinkerbell` got there first.
    Duplicate(String),
    /// A version change that cannot carry the objects along.
    DowngradeRefused(String),
}

impl Refusal {
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::InvalidSpec(_) => "InvalidSpec",
            Refusal::UnknownVersion(_) => "UnknownVersion",
            Refusal::Conflict(_) => "Conflict",
            Refusal::Duplicate(_) => "Duplicate",
            Refusal::DowngradeRefused(_) => "DowngradeRefused",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Refusal::InvalidSpec(m)
            | Refusal::UnknownVersion(m)
            | Refusal::Conflict(m)
            | Refusal::Duplicate(m)
            | Refusal::DowngradeRefused(m) => m,
        }
    }
}

/// Check `spec` (the resource's `spec`, maybe absent) against the known
/// releases and tinkerbox's roles.
pub fn plan(owner: &Owner, spec: Option<&Value>, roles: Roles) -> Result<Plan, Refusal> {
    let spec: Spec = match spec {
        None | Some(Value::Null) => Spec::default(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| Refusal::InvalidSpec(format!("spec: {e}")))?,
    };
    let release = release::find(&spec.version).ok_or_else(|| {
        Refusal::UnknownVersion(format!(
            "spec.version {:?} is not a release tinkerbox knows (it knows {})",
            spec.version,
            release::known()
        ))
    })?;
    if !dns_label(&owner.name) {
        return Err(Refusal::InvalidSpec(format!(
            "metadata.name {:?}: must be a DNS label (it names the objects' labels)",
            owner.name
        )));
    }
    let namespace = if spec.namespace.is_empty() {
        owner.namespace.clone()
    } else {
        spec.namespace.clone()
    };
    if !dns_label(&namespace) {
        return Err(Refusal::InvalidSpec(format!(
            "spec.namespace {namespace:?}: not a namespace name"
        )));
    }
    let public_ip = match spec.public_ip.trim() {
        "" => None,
        ip => Some(ip.parse().map_err(|_| {
            Refusal::InvalidSpec(format!("spec.publicIP {ip:?}: not an IP address"))
        })?),
    };
    if let Some(s) = spec.image_pull_secrets.iter().find(|s| s.is_empty()) {
        return Err(Refusal::InvalidSpec(format!(
            "spec.imagePullSecrets: {s:?} is not a Secret name"
        )));
    }
    let mut components = vec![];
    for c in Component::ALL {
        let cs = match c {
            Component::TinkServer => &spec.tink_server,
            Component::TinkController => &spec.tink_controller,
            Component::Rufio => &spec.rufio,
        };
        let field = c.spec_field();
        let role = role_of(roles, c);
        if cs.enabled == Some(true) && role == Role::Native {
            return Err(Refusal::Conflict(format!(
                "spec.{field}.enabled is true, but tinkerbox runs {} itself ([kube] {} = \"native\"): \
                 two would act on the same objects. Set [kube] {} = \"external\", or leave {field} disabled",
                c.runs(),
                c.role_key(),
                c.role_key()
            )));
        }
        if c != Component::TinkServer && (cs.service_type.is_some() || cs.tls.is_some()) {
            return Err(Refusal::InvalidSpec(format!(
                "spec.{field}: serviceType and tls are tink-server's (spec.tinkServer)"
            )));
        }
        if let Some(r) = cs.replicas
            && r < 0
        {
            return Err(Refusal::InvalidSpec(format!(
                "spec.{field}.replicas {r}: must be 0 or more"
            )));
        }
        if let Some(tls) = &cs.tls
            && tls.secret_name.is_empty()
        {
            return Err(Refusal::InvalidSpec(format!(
                "spec.{field}.tls.secretName: required with tls"
            )));
        }
        if let Some(e) = cs.env.iter().find(|e| {
            e.get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        }) {
            return Err(Refusal::InvalidSpec(format!(
                "spec.{field}.env: an entry without a name: {e}"
            )));
        }
        if cs.tls.is_some() && release.profile == release::Profile::Split {
            return Err(Refusal::Conflict(format!(
                "spec.{field}.tls: tink-server {} serves plain gRPC only (TLS needs a newer release)",
                release.version
            )));
        }
        if cs.image.as_deref().is_some_and(|i| i.trim().is_empty()) {
            return Err(Refusal::InvalidSpec(format!(
                "spec.{field}.image: empty (leave it out for the release's image)"
            )));
        }
        if cs.enabled.unwrap_or(role == Role::External) {
            components.push((c, cs.clone()));
        }
    }
    let on = |c| components.iter().any(|(k, _)| *k == c);
    if on(Component::TinkController) != on(Component::TinkServer) {
        return Err(Refusal::Conflict(
            "spec.tinkServer and spec.tinkController: run both or neither \
             (agents talk to tink-server; tink-controller moves the Workflows they report on)"
                .into(),
        ));
    }
    Ok(Plan {
        owner: owner.clone(),
        release,
        namespace,
        scope: spec.scope,
        registry: spec.registry.trim().trim_end_matches('/').to_string(),
        image_pull_secrets: spec.image_pull_secrets,
        public_ip,
        crds: spec.crds,
        components,
    })
}

impl Plan {
    pub fn enabled(&self, c: Component) -> Option<&ComponentSpec> {
        self.components
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, s)| s)
    }

    /// The image a component runs: the override, else the release's with
    /// its registry replaced by `spec.registry`.
    pub fn image(&self, c: Component) -> String {
        if let Some(i) = self.enabled(c).and_then(|s| s.image.clone()) {
            return i;
        }
        let image = self.release.image(c);
        match (self.registry.as_str(), image.split_once('/')) {
            ("", _) | (_, None) => image.to_string(),
            (reg, Some((_, rest))) => format!("{reg}/{rest}"),
        }
    }

    /// Whether tink-server serves TLS (agents are told `tinkerbell_tls=true`).
    pub fn tls(&self) -> bool {
        self.enabled(Component::TinkServer)
            .is_some_and(|s| s.tls.is_some())
    }
}

/// What the supervisor's unit tests share.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{Owner, Roles};
    use crate::config::Role;

    pub(crate) fn owner() -> Owner {
        Owner {
            namespace: "tink".into(),
            name: "stack".into(),
            uid: "u-1".into(),
        }
    }

    pub(crate) const EXTERNAL: Roles = Roles {
        tink: Role::External,
        rufio: Role::External,
        zero_touch: false,
        metal3: false,
        cleaning: false,
    };
}

#[cfg(test)]
mod tests {
    use super::fixtures::{EXTERNAL, owner};
    use super::*;
    use serde_json::json;

    #[test]
    fn an_empty_spec_runs_the_newest_release_of_what_tinkerbox_does_not_run() {
        let p = plan(&owner(), None, EXTERNAL).unwrap();
        assert_eq!(p.release.version, "v0.25.0");
        assert_eq!(p.namespace, "tink");
        assert_eq!(p.scope, Scope::Cluster);
        assert_eq!(p.components.len(), 3);
        let rufio_native = Roles {
            tink: Role::External,
            rufio: Role::Native,
            zero_touch: false,
            metal3: false,
            cleaning: false,
        };
        let p = plan(&owner(), Some(&json!({})), rufio_native).unwrap();
        let on: Vec<_> = p.components.iter().map(|(c, _)| *c).collect();
        assert_eq!(on, [Component::TinkServer, Component::TinkController]);
        assert_eq!(
            p.image(Component::TinkServer),
            "ghcr.io/tinkerbell/tinkerbell:v0.25.0"
        );
    }

    #[test]
    fn versions_images_and_registry() {
        let p = plan(
            &owner(),
            Some(&json!({"version": "0.12.2", "registry": "mirror.lab:5000/",
                "rufio": {"image": "my/rufio:dev"}})),
            EXTERNAL,
        )
        .unwrap();
        assert_eq!(p.release.version, "v0.12.2");
        assert_eq!(
            p.image(Component::TinkController),
            "mirror.lab:5000/tinkerbell/tink-controller:v0.12.2"
        );
        assert_eq!(p.image(Component::Rufio), "my/rufio:dev");
    }

    #[test]
    fn bad_specs_are_refused_with_what_is_wrong() {
        let refused = |spec: Value, roles: Roles| plan(&owner(), Some(&spec), roles).unwrap_err();
        let r = refused(json!({"version": "v9.9.9"}), EXTERNAL);
        assert_eq!(r.reason(), "UnknownVersion");
        assert!(r.message().contains("v0.12.2, v0.25.0"), "{}", r.message());
        let r = refused(json!({"versoin": "v0.25.0"}), EXTERNAL);
        assert_eq!(r.reason(), "InvalidSpec");
        assert!(r.message().contains("versoin"), "{}", r.message());
        let native = Roles {
            tink: Role::Native,
            rufio: Role::Native,
            zero_touch: false,
            metal3: false,
            cleaning: false,
        };
        let r = refused(json!({"rufio": {"enabled": true}}), native);
        assert_eq!(r.reason(), "Conflict");
        assert!(r.message().contains("[kube] rufio"), "{}", r.message());
        let r = refused(
            json!({"version": "v0.12.2", "tinkServer": {"tls": {"secretName": "t"}}}),
            EXTERNAL,
        );
        assert_eq!(r.reason(), "Conflict");
        assert!(r.message().contains("plain gRPC"), "{}", r.message());
        let r = refused(json!({"tinkServer": {"enabled": false}}), EXTERNAL);
        assert_eq!(r.reason(), "Conflict");
        for bad in [
            json!({"rufio": {"tls": {"secretName": "x"}}}),
            json!({"tinkServer": {"replicas": -1}}),
            json!({"tinkServer": {"tls": {}}}),
            json!({"tinkServer": {"env": [{"value": "x"}]}}),
            json!({"namespace": "Not_A_Namespace"}),
            json!({"publicIP": "ten.one"}),
            json!({"scope": "Galaxy"}),
        ] {
            assert_eq!(
                refused(bad.clone(), EXTERNAL).reason(),
                "InvalidSpec",
                "{bad}"
            );
        }
        // Everything native and nothing asked: nothing to run, no conflict.
        assert!(plan(&owner(), None, native).unwrap().components.is_empty());
    }
}
