//! What a [`Plan`] means on the cluster (a chart's worth of objects), and
//! what the Deployments' own status says of each component. Pure: the
//! controller applies and reads, this decides.

use super::release::{self, GRPC_PORT, Profile, Rule};
use super::spec::{Plan, Scope, ServiceType};
use super::{Component, GROUP, KIND, MANAGED_BY, OWNER_NAME, OWNER_NAMESPACE, VERSION};
use serde::Serialize;
use serde_json::{Map, Value, json};

/// The kinds the supervisor makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ManagedKind {
    Namespace,
    ServiceAccount,
    ClusterRole,
    ClusterRoleBinding,
    Role,
    RoleBinding,
    Service,
    Deployment,
}

impl ManagedKind {
    /// What is pruned and removed with the resource (a Namespace never
    /// is: it holds the user's objects).
    pub const OWNED: [ManagedKind; 7] = [
        ManagedKind::Deployment,
        ManagedKind::Service,
        ManagedKind::RoleBinding,
        ManagedKind::Role,
        ManagedKind::ClusterRoleBinding,
        ManagedKind::ClusterRole,
        ManagedKind::ServiceAccount,
    ];

    pub fn api_version(self) -> &'static str {
        match self {
            ManagedKind::Namespace | ManagedKind::ServiceAccount | ManagedKind::Service => "v1",
            ManagedKind::Deployment => "apps/v1",
            _ => "rbac.authorization.k8s.io/v1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            ManagedKind::Namespace => "Namespace",
            ManagedKind::ServiceAccount => "ServiceAccount",
            ManagedKind::ClusterRole => "ClusterRole",
            ManagedKind::ClusterRoleBinding => "ClusterRoleBinding",
            ManagedKind::Role => "Role",
            ManagedKind::RoleBinding => "RoleBinding",
            ManagedKind::Service => "Service",
            ManagedKind::Deployment => "Deployment",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            ManagedKind::Namespace => "namespaces",
            ManagedKind::ServiceAccount => "serviceaccounts",
            ManagedKind::ClusterRole => "clusterroles",
            ManagedKind::ClusterRoleBinding => "clusterrolebindings",
            ManagedKind::Role => "roles",
            ManagedKind::RoleBinding => "rolebindings",
            ManagedKind::Service => "services",
            ManagedKind::Deployment => "deployments",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            ManagedKind::Namespace | ManagedKind::ClusterRole | ManagedKind::ClusterRoleBinding
        )
    }
}

/// One object to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub kind: ManagedKind,
    pub namespace: Option<String>,
    pub name: String,
    pub body: Value,
}

impl Object {
    /// `Kind/name` or `Kind/namespace/name`, for events and logs.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind.kind(), self.name),
            None => format!("{}/{}", self.kind.kind(), self.name),
        }
    }
}

/// The labels every object (and pod) gets.
fn labels(plan: &Plan, c: Option<Component>) -> Value {
    let mut l = json!({
        "app.kubernetes.io/part-of": "tinkerbell",
        "app.kubernetes.io/instance": plan.owner.name,
        "app.kubernetes.io/version": plan.release.version,
        MANAGED_BY: "tinkerbox",
        OWNER_NAMESPACE: plan.owner.namespace,
        OWNER_NAME: plan.owner.name,
    });
    if let Some(c) = c {
        l["app.kubernetes.io/name"] = json!(c.name());
    }
    l
}

/// A Deployment's selector: never changes across versions (it cannot).
fn selector(plan: &Plan, c: Component) -> Value {
    json!({"app.kubernetes.io/name": c.name(), "app.kubernetes.io/instance": plan.owner.name})
}

fn object(plan: &Plan, kind: ManagedKind, name: &str, c: Option<Component>, rest: Value) -> Object {
    let namespace = kind.namespaced().then(|| plan.namespace.clone());
    let mut meta = json!({"name": name, "labels": labels(plan, c)});
    if let Some(ns) = &namespace {
        meta["namespace"] = json!(ns);
        // Same namespace: the API server's garbage collector also removes
        // it with the resource (owner references cannot cross namespaces).
        if *ns == plan.owner.namespace {
            meta["ownerReferences"] = json!([{
                "apiVersion": format!("{GROUP}/{VERSION}"), "kind": KIND,
                "name": plan.owner.name, "uid": plan.owner.uid,
                "controller": true, "blockOwnerDeletion": true,
            }]);
        }
    }
    let mut body = json!({"apiVersion": kind.api_version(), "kind": kind.kind(), "metadata": meta});
    if let (Some(b), Value::Object(r)) = (body.as_object_mut(), rest) {
        b.extend(r);
    }
    Object {
        kind,
        namespace,
        name: name.to_string(),
        body,
    }
}

fn rules_json(rules: &[Rule]) -> Value {
    rules
        .iter()
        .map(|(g, r, v)| json!({"apiGroups": g, "resources": r, "verbs": v}))
        .collect()
}

/// Cluster-scoped names carry the namespace: two stacks in two namespaces
/// must not share them.
pub fn cluster_name(plan: &Plan, c: Component) -> String {
    format!("{}-{}", c.name(), plan.namespace)
}

/// Everything the plan means, in apply order (what a Deployment needs
/// exists before it).
pub fn objects(plan: &Plan) -> Vec<Object> {
    let mut out = vec![];
    if plan.namespace != plan.owner.namespace {
        out.push(object(
            plan,
            ManagedKind::Namespace,
            &plan.namespace,
            None,
            json!({}),
        ));
    }
    for (c, _) in &plan.components {
        let c = *c;
        let sa = c.name();
        out.push(object(
            plan,
            ManagedKind::ServiceAccount,
            sa,
            Some(c),
            json!({}),
        ));
        let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": plan.namespace}]);
        let rules = rules_json(release::rules(c));
        match plan.scope {
            Scope::Cluster => {
                let name = cluster_name(plan, c);
                out.push(object(
                    plan,
                    ManagedKind::ClusterRole,
                    &name,
                    Some(c),
                    json!({"rules": rules}),
                ));
                out.push(object(
                    plan,
                    ManagedKind::ClusterRoleBinding,
                    &name,
                    Some(c),
                    json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                        "subjects": subject}),
                ));
            }
            Scope::Namespace => {
                out.push(object(
                    plan,
                    ManagedKind::Role,
                    sa,
                    Some(c),
                    json!({"rules": rules}),
                ));
                out.push(object(
                    plan,
                    ManagedKind::RoleBinding,
                    sa,
                    Some(c),
                    json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
                        "subjects": subject}),
                ));
            }
        }
        if c.elects() {
            let name = format!("{}-leader-election", c.name());
            out.push(object(
                plan,
                ManagedKind::Role,
                &name,
                Some(c),
                json!({"rules": rules_json(release::LEADER_RULES)}),
            ));
            out.push(object(
                plan,
                ManagedKind::RoleBinding,
                &name,
                Some(c),
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": subject}),
            ));
        }
        if c == Component::TinkServer {
            out.push(service(plan));
        }
        out.push(deployment(plan, c));
    }
    out
}

fn service(plan: &Plan) -> Object {
    let c = Component::TinkServer;
    let ty = plan
        .enabled(c)
        .and_then(|s| s.service_type)
        .unwrap_or(ServiceType::LoadBalancer);
    let mut spec = json!({
        "type": ty,
        "selector": selector(plan, c),
        "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}],
    });
    if let (ServiceType::LoadBalancer, Some(ip)) = (ty, plan.public_ip) {
        spec["loadBalancerIP"] = json!(ip.to_string());
    }
    object(
        plan,
        ManagedKind::Service,
        c.name(),
        Some(c),
        json!({"spec": spec}),
    )
}

/// Where a component's TLS Secret is mounted.
const TLS_DIR: &str = "/etc/tinkerbell/tls";

/// The release's own arguments, environment, ports and probes.
fn container(plan: &Plan, c: Component) -> Map<String, Value> {
    let ns_scope = plan.scope == Scope::Namespace;
    let ns = &plan.namespace;
    let tls = plan.tls() && c == Component::TinkServer;
    let mut args: Vec<String> = vec![];
    let mut env: Vec<Value> = vec![];
    let mut ports = vec![];
    let probe = |port: &str, path: &str| json!({"httpGet": {"path": path, "port": port}});
    let probes;
    match plan.release.profile {
        Profile::Split => match c {
            Component::TinkServer => {
                args.push("--backend=kubernetes".into());
                if ns_scope {
                    args.push(format!("--kube-namespace={ns}"));
                }
                // (v0.12's tink-server has no TLS: `spec::plan` refuses it.)
                ports.push(json!({"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}));
                // --http-authority (:42114): /healthz, /metrics.
                ports.push(json!({"name": "http", "containerPort": 42114, "protocol": "TCP"}));
                probes = Some(("http", "/healthz", "/healthz"));
            }
            Component::TinkController => {
                args.push("--leader-elect".into());
                if ns_scope {
                    args.push(format!("--namespace={ns}"));
                }
                ports.push(json!({"name": "probes", "containerPort": 8081, "protocol": "TCP"}));
                probes = Some(("probes", "/healthz", "/readyz"));
            }
            Component::Rufio => {
                args.push("--leader-elect".into());
                if ns_scope {
                    args.push(format!("--kube-namespace={ns}"));
                }
                ports.push(json!({"name": "probes", "containerPort": 8081, "protocol": "TCP"}));
                probes = Some(("probes", "/healthz", "/readyz"));
            }
        },
        Profile::Single => {
            let on = |k: Component| if k == c { "true" } else { "false" };
            let mut put =
                |k: &str, v: &str| env.push(json!({"name": format!("TINKERBELL_{k}"), "value": v}));
            for off in [
                "ENABLE_SMEE",
                "ENABLE_TOOTLES",
                "ENABLE_SECONDSTAR",
                "ENABLE_UI",
            ] {
                put(off, "false");
            }
            put("ENABLE_TINK_SERVER", on(Component::TinkServer));
            put("ENABLE_TINK_CONTROLLER", on(Component::TinkController));
            put("ENABLE_RUFIO_CONTROLLER", on(Component::Rufio));
            // tinkerbox applies the release's CRDs (and migrates first).
            put("ENABLE_CRD_MIGRATIONS", "false");
            if ns_scope {
                put("BACKEND_KUBE_NAMESPACE", ns);
            }
            match c {
                Component::TinkController => {
                    put("TINK_CONTROLLER_ENABLE_LEADER_ELECTION", "true");
                    put("TINK_CONTROLLER_LEADER_ELECTION_NAMESPACE", ns);
                }
                Component::Rufio => {
                    put("RUFIO_CONTROLLER_ENABLE_LEADER_ELECTION", "true");
                    put("RUFIO_CONTROLLER_LEADER_ELECTION_NAMESPACE", ns);
                }
                Component::TinkServer => {}
            }
            if let Some(ip) = plan.public_ip.filter(std::net::IpAddr::is_ipv4) {
                put("PUBLIC_IPV4", &ip.to_string());
            }
            if c == Component::TinkServer {
                put("TINK_SERVER_BIND_PORT", &GRPC_PORT.to_string());
                if tls {
                    // Global in the single binary: gRPC and HTTPS (7443) both.
                    put("TLS_CERT_FILE", &format!("{TLS_DIR}/tls.crt"));
                    put("TLS_KEY_FILE", &format!("{TLS_DIR}/tls.key"));
                }
                ports.push(json!({"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}));
            }
            ports.push(json!({"name": "http", "containerPort": 7080, "protocol": "TCP"}));
            probes = Some(("http", "/healthz", "/readyz"));
        }
    }
    let spec = plan.enabled(c).cloned().unwrap_or_default();
    args.extend(spec.args.iter().cloned());
    for e in &spec.env {
        let name = e.get("name").cloned();
        env.retain(|d| d.get("name") != name.as_ref());
        env.push(e.clone());
    }
    let mut m = Map::new();
    m.insert("name".into(), json!(c.name()));
    m.insert("image".into(), json!(plan.image(c)));
    if !args.is_empty() {
        m.insert("args".into(), json!(args));
    }
    if !env.is_empty() {
        m.insert("env".into(), json!(env));
    }
    if !ports.is_empty() {
        m.insert("ports".into(), json!(ports));
    }
    if let Some((port, live, ready)) = probes {
        m.insert("livenessProbe".into(), probe(port, live));
        m.insert("readinessProbe".into(), probe(port, ready));
    }
    m.insert(
        "resources".into(),
        spec.resources.unwrap_or_else(|| {
            json!({"limits": {"cpu": "500m", "memory": "128Mi"},
                "requests": {"cpu": "10m", "memory": "64Mi"}})
        }),
    );
    if tls {
        m.insert(
            "volumeMounts".into(),
            json!([{"name": "tls", "mountPath": TLS_DIR, "readOnly": true}]),
        );
    }
    m
}

fn deployment(plan: &Plan, c: Component) -> Object {
    let spec = plan.enabled(c).cloned().unwrap_or_default();
    let mut pod = json!({
        "serviceAccountName": c.name(),
        "containers": [Value::Object(container(plan, c))],
    });
    if !plan.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = plan
            .image_pull_secrets
            .iter()
            .map(|s| json!({"name": s}))
            .collect();
    }
    if let Some(tls) = spec.tls.as_ref().filter(|_| c == Component::TinkServer) {
        pod["volumes"] = json!([{"name": "tls", "secret": {"secretName": tls.secret_name}}]);
    }
    object(
        plan,
        ManagedKind::Deployment,
        c.name(),
        Some(c),
        json!({"spec": {
            "replicas": spec.replicas.unwrap_or(1),
            "selector": {"matchLabels": selector(plan, c)},
            "template": {"metadata": {"labels": labels(plan, Some(c))}, "spec": pod},
        }}),
    )
}

/// One condition of a component, as the resource's status carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

fn cond(t: &str, on: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: t.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
    }
}

/// A component's health, from its Deployment as the API server has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    pub name: String,
    pub image: String,
    pub replicas: i64,
    pub ready_replicas: i64,
    pub updated_replicas: i64,
    pub conditions: Vec<Condition>,
}

impl ComponentStatus {
    pub fn available(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    }
}

/// `Available`, `Progressing` and `Degraded` of a component from its
/// Deployment (`None`: not there). Only what the Deployment's status says:
/// a cluster where nothing runs pods (no kubelet, no controller-manager)
/// honestly shows not available.
pub fn component_status(c: Component, want_image: &str, d: Option<&Value>) -> ComponentStatus {
    let int = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let Some(d) = d else {
        return ComponentStatus {
            name: c.name().into(),
            image: want_image.into(),
            replicas: 0,
            ready_replicas: 0,
            updated_replicas: 0,
            conditions: vec![
                cond(
                    "Available",
                    false,
                    "NotCreated",
                    "the Deployment does not exist yet".into(),
                ),
                cond(
                    "Progressing",
                    true,
                    "Creating",
                    "the Deployment is being created".into(),
                ),
                cond("Degraded", false, "NotCreated", String::new()),
            ],
        };
    };
    let want = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let ready = int(d, "/status/readyReplicas");
    let available = int(d, "/status/availableReplicas");
    let updated = int(d, "/status/updatedReplicas");
    let observed = int(d, "/status/observedGeneration");
    let generation = int(d, "/metadata/generation");
    let dc = |t: &str| {
        d.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|c| c["type"] == t))
    };
    let text = |v: Option<&Value>, k: &str| {
        v.and_then(|c| c[k].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let image = d
        .pointer("/spec/template/spec/containers/0/image")
        .and_then(Value::as_str)
        .unwrap_or(want_image)
        .to_string();
    let is_available = if want == 0 {
        true
    } else {
        dc("Available").is_some_and(|c| c["status"] == "True") && available >= want.min(1)
    };
    let available_c = if want == 0 {
        cond("Available", true, "ScaledToZero", "replicas is 0".into())
    } else if is_available {
        cond(
            "Available",
            true,
            "MinimumReplicasAvailable",
            format!("{available} of {want} replicas available"),
        )
    } else {
        let reason = dc("Available")
            .and_then(|c| c["reason"].as_str())
            .unwrap_or("NoReplicasAvailable");
        cond(
            "Available",
            false,
            reason,
            format!(
                "{available} of {want} replicas available{}",
                if dc("Available").is_none() && observed == 0 {
                    " (no controller has acted on the Deployment yet)"
                } else {
                    ""
                }
            ),
        )
    };
    let deadline = dc("Progressing")
        .is_some_and(|c| c["status"] == "False" && c["reason"] == "ProgressDeadlineExceeded");
    let failure = dc("ReplicaFailure").filter(|c| c["status"] == "True");
    let rolling = observed < generation || updated < want || ready < want;
    let progressing = if deadline {
        cond(
            "Progressing",
            false,
            "ProgressDeadlineExceeded",
            text(dc("Progressing"), "message"),
        )
    } else if rolling {
        cond(
            "Progressing",
            true,
            "RollingOut",
            format!("{updated} of {want} replicas updated, {ready} ready"),
        )
    } else {
        cond("Progressing", false, "Complete", String::new())
    };
    let degraded = if let Some(f) = failure {
        cond("Degraded", true, "ReplicaFailure", text(Some(f), "message"))
    } else if deadline {
        cond(
            "Degraded",
            true,
            "ProgressDeadlineExceeded",
            text(dc("Progressing"), "message"),
        )
    } else if !is_available && observed > 0 && ready < want {
        cond(
            "Degraded",
            true,
            "Unavailable",
            format!("{ready} of {want} replicas ready"),
        )
    } else {
        cond("Degraded", false, "AsExpected", String::new())
    };
    ComponentStatus {
        name: c.name().into(),
        image,
        replicas: want,
        ready_replicas: ready,
        updated_replicas: updated,
        conditions: vec![available_c, progressing, degraded],
    }
}

/// Whether `live` (as the API server has it) still has every field of
/// `want` with the same value (what others or the server added is fine).
/// Arrays compare element by element, lengths equal.
pub fn holds(live: &Value, want: &Value) -> bool {
    match (live, want) {
        (Value::Object(l), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| l.get(k).is_some_and(|lv| holds(lv, v))),
        (Value::Array(l), Value::Array(w)) => {
            l.len() == w.len() && l.iter().zip(w).all(|(a, b)| holds(a, b))
        }
        // The API server writes quantities and ports its own way.
        (Value::String(l), Value::Number(w)) | (Value::Number(w), Value::String(l)) => {
            l == &w.to_string()
        }
        (l, w) => l == w,
    }
}

#[cfg(test)]
mod tests {
    use super::super::spec::fixtures::{EXTERNAL, owner};
    use super::super::spec::plan;
    use super::*;

    fn find<'a>(objs: &'a [Object], id: &str) -> &'a Value {
        &objs
            .iter()
            .find(|o| o.id() == id)
            .unwrap_or_else(|| {
                panic!(
                    "no {id} in {:?}",
                    objs.iter().map(Object::id).collect::<Vec<_>>()
                )
            })
            .body
    }

    #[test]
    fn the_current_release_is_one_image_run_once_per_component() {
        let p = plan(&owner(), Some(&json!({"publicIP": "10.1.1.5"})), EXTERNAL).unwrap();
        let objs = objects(&p);
        let ids: Vec<String> = objs.iter().map(Object::id).collect();
        assert_eq!(
            ids,
            [
                "ServiceAccount/tink/tink-server",
                "ClusterRole/tink-server-tink",
                "ClusterRoleBinding/tink-server-tink",
                "Service/tink/tink-server",
                "Deployment/tink/tink-server",
                "ServiceAccount/tink/tink-controller",
                "ClusterRole/tink-controller-tink",
                "ClusterRoleBinding/tink-controller-tink",
                "Role/tink/tink-controller-leader-election",
                "RoleBinding/tink/tink-controller-leader-election",
                "Deployment/tink/tink-controller",
                "ServiceAccount/tink/rufio",
                "ClusterRole/rufio-tink",
                "ClusterRoleBinding/rufio-tink",
                "Role/tink/rufio-leader-election",
                "RoleBinding/tink/rufio-leader-election",
                "Deployment/tink/rufio",
            ]
        );
        let d = find(&objs, "Deployment/tink/rufio");
        let ctr = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(ctr["image"], "ghcr.io/tinkerbell/tinkerbell:v0.25.0");
        let env: Vec<String> = ctr["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                format!(
                    "{}={}",
                    e["name"].as_str().unwrap(),
                    e["value"].as_str().unwrap()
                )
            })
            .collect();
        assert!(
            env.contains(&"TINKERBELL_ENABLE_RUFIO_CONTROLLER=true".into()),
            "{env:?}"
        );
        assert!(
            env.contains(&"TINKERBELL_ENABLE_TINK_SERVER=false".into()),
            "{env:?}"
        );
        assert!(
            env.contains(&"TINKERBELL_ENABLE_SMEE=false".into()),
            "{env:?}"
        );
        assert!(
            env.contains(&"TINKERBELL_ENABLE_CRD_MIGRATIONS=false".into()),
            "{env:?}"
        );
        assert!(
            env.contains(&"TINKERBELL_PUBLIC_IPV4=10.1.1.5".into()),
            "{env:?}"
        );
        assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(
            d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            "rufio"
        );
        assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(d["metadata"]["labels"][OWNER_NAME], "stack");
        // Cluster-scoped: no owner reference (the finalizer removes them).
        assert!(
            find(&objs, "ClusterRole/rufio-tink")["metadata"]
                .get("ownerReferences")
                .is_none()
        );
        let tls = plan(
            &owner(),
            Some(&json!({"tinkServer": {"tls": {"secretName": "tink-tls"}}})),
            EXTERNAL,
        )
        .unwrap();
        assert!(tls.tls());
        let objs_tls = objects(&tls);
        let pod = &find(&objs_tls, "Deployment/tink/tink-server")["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][0]["secret"]["secretName"], "tink-tls");
        assert!(
            pod["containers"][0]["env"]
                .to_string()
                .contains("TINKERBELL_TLS_CERT_FILE")
        );
        let svc = find(&objs, "Service/tink/tink-server");
        assert_eq!(svc["spec"]["type"], "LoadBalancer");
        assert_eq!(svc["spec"]["loadBalancerIP"], "10.1.1.5");
        assert_eq!(svc["spec"]["ports"][0]["port"], 42113);
    }

    #[test]
    fn v012_is_three_images_with_flags_and_namespace_scope_uses_roles() {
        let spec = json!({"version": "v0.12.2", "scope": "Namespace", "namespace": "tinkerbell",
            "imagePullSecrets": ["regcred"],
            "tinkServer": {"serviceType": "ClusterIP",
                "args": ["--log-level=debug"], "replicas": 2},
            "rufio": {"env": [{"name": "X", "value": "1"}],
                "resources": {"limits": {"memory": "1Gi"}}}});
        let p = plan(&owner(), Some(&spec), EXTERNAL).unwrap();
        let objs = objects(&p);
        assert_eq!(
            objs[0].id(),
            "Namespace/tinkerbell",
            "another namespace is made first"
        );
        let d = find(&objs, "Deployment/tinkerbell/tink-server");
        assert!(
            d["metadata"].get("ownerReferences").is_none(),
            "not the owner's namespace"
        );
        assert_eq!(d["spec"]["replicas"], 2);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
        let ctr = &pod["containers"][0];
        assert_eq!(ctr["image"], "quay.io/tinkerbell/tink:v0.12.2");
        let args: Vec<&str> = ctr["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[0], "--backend=kubernetes");
        assert!(args.contains(&"--kube-namespace=tinkerbell"));
        assert_eq!(
            args.last(),
            Some(&"--log-level=debug"),
            "the user's come last"
        );
        let rufio = find(&objs, "Deployment/tinkerbell/rufio");
        let ctr = &rufio["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(ctr["image"], "quay.io/tinkerbell/rufio:v0.6.3");
        assert_eq!(ctr["args"][0], "--leader-elect");
        assert_eq!(ctr["env"], json!([{"name": "X", "value": "1"}]));
        assert_eq!(ctr["resources"], json!({"limits": {"memory": "1Gi"}}));
        let role = find(&objs, "Role/tinkerbell/rufio");
        assert!(role["rules"].to_string().contains("machines/finalizers"));
        assert_eq!(
            find(&objs, "RoleBinding/tinkerbell/rufio")["subjects"][0]["namespace"],
            "tinkerbell"
        );
        assert_eq!(
            find(&objs, "Service/tinkerbell/tink-server")["spec"]["type"],
            "ClusterIP"
        );
        assert!(!objs.iter().any(|o| o.kind == ManagedKind::ClusterRole));
    }

    #[test]
    fn health_comes_from_the_deployments_own_status() {
        let none = component_status(Component::Rufio, "img", None);
        assert!(!none.available());
        assert_eq!(none.conditions[0].reason, "NotCreated");
        // As a bare API server leaves it: no controller ever acted.
        let fresh = json!({"metadata": {"generation": 1}, "spec": {"replicas": 1,
            "template": {"spec": {"containers": [{"image": "img:1"}]}}}});
        let s = component_status(Component::Rufio, "img:1", Some(&fresh));
        assert!(!s.available());
        assert!(
            s.conditions[0].message.contains("no controller has acted"),
            "{:?}",
            s.conditions
        );
        assert_eq!(s.conditions[1].reason, "RollingOut");
        assert_eq!(s.conditions[2].status, "False");
        let good = json!({"metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 2,
                "availableReplicas": 2, "updatedReplicas": 2,
                "conditions": [{"type": "Available", "status": "True"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}});
        let s = component_status(Component::Rufio, "img", Some(&good));
        assert!(s.available());
        assert_eq!(s.conditions[1].reason, "Complete");
        let stuck = json!({"metadata": {"generation": 3}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1,
                "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                    {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                     "message": "ReplicaSet has timed out progressing."}]}});
        let s = component_status(Component::Rufio, "img", Some(&stuck));
        assert!(!s.available());
        assert_eq!(s.conditions[0].reason, "MinimumReplicasUnavailable");
        assert_eq!(
            (
                s.conditions[2].status.as_str(),
                s.conditions[2].reason.as_str()
            ),
            ("True", "ProgressDeadlineExceeded")
        );
    }

    #[test]
    fn holds_ignores_what_others_added_and_sees_what_changed() {
        let want = json!({"spec": {"replicas": 1, "ports": [{"port": 42113}]}});
        let live = json!({"spec": {"replicas": 1, "ports": [{"port": 42113, "protocol": "TCP"}],
            "clusterIP": "10.0.0.9"}, "status": {}});
        assert!(holds(&live, &want));
        assert!(!holds(
            &json!({"spec": {"replicas": 3, "ports": [{"port": 42113}]}}),
            &want
        ));
        assert!(!holds(
            &json!({"spec": {"replicas": 1, "ports": []}}),
            &want
        ));
        assert!(holds(&json!({"port": "8081"}), &json!({"port": 8081})));
    }
}
