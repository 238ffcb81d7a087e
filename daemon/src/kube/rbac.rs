//! `tinkerbox kube rbac`: the ServiceAccount and the (Cluster)Role and
//! binding with the permissions tinkerbox needs in kube mode, and no more,
//! for the roles it plays (Tink and Rufio native or external).
//!
//! The rules come from one typed table ([`ALWAYS`], [`TINK_NATIVE`],
//! [`RUFIO_NATIVE`]), merged per resource and rendered with k8s-openapi's
//! own RBAC types: a permission is added in one place, and the tests read
//! the effective permissions back from the rules.

// `[kube] tink`/`rufio`'s type; named Mode here, as `Role` is RBAC's.
use crate::config::Role as Mode;
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// Verbs on resources of one API group.
#[derive(Debug)]
pub struct Grant {
    /// `""`: the core group.
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["update", "patch"];
const CREATE_DELETE: &[&str] = &["create", "delete"];

/// Every mode: the read-only mirror, leader election and events.
pub const ALWAYS: &[Grant] = &[
    // The mirror: every kind tinkerbox serves, and the BMC Secrets.
    Grant {
        group: "tinkerbell.org",
        resources: &["hardware", "templates", "workflows", "workflowrulesets"],
        verbs: READ,
    },
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["machines", "jobs", "tasks"],
        verbs: READ,
    },
    Grant {
        group: "",
        resources: &["secrets"],
        verbs: READ,
    },
    // Leader election: one replica writes.
    Grant {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "list", "watch", "create", "update", "patch"],
    },
    // What happened to an object, for `kubectl describe`.
    Grant {
        group: "",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];

/// Tink native: tinkerbox runs the workflows (tink-controller's job).
pub const TINK_NATIVE: &[Grant] = &[
    // spec.allowPXE flipped around a workflow, and the Hardware's status.
    Grant {
        group: "tinkerbell.org",
        resources: &["hardware", "hardware/status"],
        verbs: WRITE,
    },
    // A workflow's progress.
    Grant {
        group: "tinkerbell.org",
        resources: &["workflows/status"],
        verbs: WRITE,
    },
    // A workflow's netboot job (power off, PXE once, power on).
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["jobs"],
        verbs: CREATE_DELETE,
    },
];

/// Zero touch (`[discovery]` enabled or enrolling): the leader makes the
/// Hardware of machines it discovers and the Workflows rulesets enroll.
pub const ZERO_TOUCH: &[Grant] = &[Grant {
    group: "tinkerbell.org",
    resources: &["hardware", "workflows"],
    verbs: &["create"],
}];

/// BareMetalHosts (`kube.metal3`): tinkerbox plays BMO (and Ironic, with
/// its own parts): the hosts' status and BMO's finalizer, the annotations
/// it acts on taken off, their HardwareData, their data Secrets read, and
/// the parts each host owns (Hardware, BMC Machine, Templates, Workflows,
/// Jobs) made, kept and removed.
pub const METAL3: &[Grant] = &[
    Grant {
        group: "metal3.io",
        resources: &["baremetalhosts"],
        verbs: &["get", "list", "watch", "update", "patch"],
    },
    Grant {
        group: "metal3.io",
        resources: &["baremetalhosts/status", "baremetalhosts/finalizers"],
        verbs: WRITE,
    },
    Grant {
        group: "metal3.io",
        resources: &["hardwaredata"],
        verbs: ALL,
    },
    Grant {
        group: "tinkerbell.org",
        resources: &["hardware", "templates", "workflows"],
        verbs: ALL,
    },
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["machines", "jobs"],
        verbs: ALL,
    },
    // The user data Secret `tinkerbox claim --user-data` makes (never over
    // an existing one), and removes at the release.
    Grant {
        group: "",
        resources: &["secrets"],
        verbs: CREATE_DELETE,
    },
];

/// Rufio native: tinkerbox drives the BMCs (rufio's job).
pub const RUFIO_NATIVE: &[Grant] = &[
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["machines/status", "jobs/status", "tasks/status"],
        verbs: WRITE,
    },
    // The inventory: a Hardware's status.attributes.outOfBand, and the
    // Machine's refresh-inventory annotation taken off once read.
    Grant {
        group: "tinkerbell.org",
        resources: &["hardware/status"],
        verbs: WRITE,
    },
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["machines"],
        verbs: WRITE,
    },
    // A Job's Tasks.
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["tasks"],
        verbs: CREATE_DELETE,
    },
    // Owner references with blockOwnerDeletion (a Task owned by its Job)
    // need update on the owner's finalizers where that admission is on.
    Grant {
        group: "bmc.tinkerbell.org",
        resources: &["machines/finalizers", "jobs/finalizers", "tasks/finalizers"],
        verbs: &["update"],
    },
];

/// Tink or Rufio external: the supervisor deploys them from a `Tinkerbell`
/// resource (`kube::supervisor`), so it makes and repairs what a chart
/// would, and migrates Workflows between releases. Granting a Role needs
/// the permissions in it, or `bind`/`escalate` (held here: the supervisor
/// grants Tink and Rufio theirs).
pub const SUPERVISOR: &[Grant] = &[
    Grant {
        group: "tinkerbox.io",
        resources: &["tinkerbells"],
        verbs: &["get", "list", "watch", "update", "patch"],
    },
    Grant {
        group: "tinkerbox.io",
        resources: &["tinkerbells/status", "tinkerbells/finalizers"],
        verbs: WRITE,
    },
    Grant {
        group: "apps",
        resources: &["deployments"],
        verbs: ALL,
    },
    Grant {
        group: "",
        resources: &["services", "serviceaccounts"],
        verbs: ALL,
    },
    Grant {
        group: "",
        resources: &["namespaces"],
        verbs: &["get", "create", "patch"],
    },
    Grant {
        group: "rbac.authorization.k8s.io",
        resources: &[
            "roles",
            "rolebindings",
            "clusterroles",
            "clusterrolebindings",
        ],
        verbs: &[
            "get", "list", "watch", "create", "update", "patch", "delete", "bind", "escalate",
        ],
    },
    Grant {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get", "create", "update", "patch", "delete"],
    },
    // A migration keeps and converts Workflows.
    Grant {
        group: "tinkerbell.org",
        resources: &["workflows", "workflows/status"],
        verbs: WRITE,
    },
    Grant {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];

const ALL: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The order verbs are printed in (kubectl's habit: reads, then writes).
const VERB_ORDER: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete", "bind", "escalate",
];

/// The roles tinkerbox plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub tink: Mode,
    pub rufio: Mode,
    /// Discovery or enrollment is on.
    pub zero_touch: bool,
    /// tinkerbox is the BareMetalHost operator (`kube.metal3`).
    pub metal3: bool,
    /// Hardware CAPT releases is cleaned (`cleaning.on_release`).
    pub cleaning: bool,
}

impl Default for Roles {
    fn default() -> Self {
        Roles {
            tink: Mode::Native,
            rufio: Mode::Native,
            zero_touch: false,
            metal3: false,
            cleaning: false,
        }
    }
}

/// Cleaning on release (`[cleaning]`): the hold on a Hardware CAPT
/// released (Tink native's Hardware grant), and the cleaning's Template
/// and Workflow made and removed.
pub const CLEANING: &[Grant] = &[Grant {
    group: "tinkerbell.org",
    resources: &["templates", "workflows"],
    verbs: &["create", "delete", "update", "patch"],
}];

/// The grants that apply to `roles`, in table order.
pub fn grants(roles: Roles) -> Vec<&'static Grant> {
    let mut g: Vec<&Grant> = ALWAYS.iter().collect();
    if roles.tink == Mode::Native {
        g.extend(TINK_NATIVE);
    }
    if roles.rufio == Mode::Native {
        g.extend(RUFIO_NATIVE);
    }
    if roles.zero_touch {
        g.extend(ZERO_TOUCH);
    }
    if roles.metal3 {
        g.extend(METAL3);
    }
    if roles.cleaning {
        g.extend(CLEANING);
    }
    if roles.tink == Mode::External || roles.rufio == Mode::External {
        g.extend(SUPERVISOR);
    }
    g
}

/// The rules for `roles`: per API group, the resources with the same verbs
/// in one rule; groups and resources in table order, so the output is
/// stable and reads like the table.
pub fn rules(roles: Roles) -> Vec<PolicyRule> {
    // (group, resource) -> verbs, in first-seen order.
    let mut per: Vec<((&str, &str), Vec<&str>)> = vec![];
    for g in grants(roles) {
        for r in g.resources {
            let i = match per.iter().position(|(k, _)| *k == (g.group, *r)) {
                Some(i) => i,
                None => {
                    per.push(((g.group, r), vec![]));
                    per.len() - 1
                }
            };
            per[i].1.extend(g.verbs);
        }
    }
    let mut groups: Vec<&str> = vec![];
    for ((group, _), verbs) in &mut per {
        verbs.sort_by_key(|v| VERB_ORDER.iter().position(|o| o == v));
        verbs.dedup();
        if !groups.contains(group) {
            groups.push(group);
        }
    }
    let mut out = vec![];
    for group in groups {
        // verbs -> resources, in first-seen order.
        let mut rules: Vec<(&Vec<&str>, Vec<String>)> = vec![];
        for ((_, resource), verbs) in per.iter().filter(|((g, _), _)| *g == group) {
            match rules.iter_mut().find(|(v, _)| *v == verbs) {
                Some((_, rs)) => rs.push(resource.to_string()),
                None => rules.push((verbs, vec![resource.to_string()])),
            }
        }
        out.extend(rules.into_iter().map(|(verbs, resources)| PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(resources),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..PolicyRule::default()
        }));
    }
    out
}

/// Whether `rules` allow `verb` on `resource` of `group` (no wildcards:
/// tinkerbox's rules have none).
pub fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

/// `kube rbac`'s options.
#[derive(Debug, Clone)]
pub struct Options {
    pub roles: Roles,
    /// The one namespace tinkerbox mirrors (a Role and RoleBinding there);
    /// `None`: every namespace (a ClusterRole and ClusterRoleBinding).
    pub namespace: Option<String>,
    pub service_account: String,
    pub sa_namespace: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            roles: Roles::default(),
            namespace: None,
            service_account: "tinkerbox".into(),
            sa_namespace: "tinkerbell".into(),
        }
    }
}

/// A DNS-1123 label: what a namespace's name (and a label value) may be.
pub fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 label, as namespaces must be (and the names here, kept
/// simple: a Role name may be more, but then so may be its mistakes).
fn check_name(what: &str, s: &str) -> anyhow::Result<()> {
    if !dns_label(s) {
        bail!("{what} {s:?}: not a valid name (lowercase letters, digits and '-', at most 63)");
    }
    Ok(())
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_string(),
            "tinkerbox".to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The manifests, as YAML documents: the ServiceAccount, then the Role and
/// RoleBinding in `namespace`, or the ClusterRole and ClusterRoleBinding.
/// The (Cluster)Role and its binding are named after the ServiceAccount.
pub fn render(o: &Options) -> anyhow::Result<String> {
    check_name("--service-account", &o.service_account)?;
    check_name("--sa-namespace", &o.sa_namespace)?;
    let ns = o.namespace.as_deref().filter(|n| !n.is_empty());
    if let Some(n) = ns {
        check_name("--namespace", n)?;
    }
    let name = o.service_account.as_str();
    let sa = ServiceAccount {
        metadata: meta(name, Some(&o.sa_namespace)),
        ..ServiceAccount::default()
    };
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(o.sa_namespace.clone()),
        ..Subject::default()
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    };
    let rules = Some(rules(o.roles));
    let mode = |m| match m {
        Mode::Native => "native",
        Mode::External => "external",
    };
    let mut out = format!(
        "# tinkerbox kube rbac: tink {}, rufio {}, {}\n",
        mode(o.roles.tink),
        mode(o.roles.rufio),
        match ns {
            Some(n) => format!("namespace {n} only"),
            None => "every namespace".into(),
        }
    );
    let sa = serde_json::to_value(&sa)?;
    let docs = match ns {
        Some(n) => [
            sa,
            serde_json::to_value(Role {
                metadata: meta(name, Some(n)),
                rules,
            })?,
            serde_json::to_value(RoleBinding {
                metadata: meta(name, Some(n)),
                role_ref: role_ref("Role"),
                subjects: Some(vec![subject]),
            })?,
        ],
        None => [
            sa,
            serde_json::to_value(ClusterRole {
                metadata: meta(name, None),
                rules,
                ..ClusterRole::default()
            })?,
            serde_json::to_value(ClusterRoleBinding {
                metadata: meta(name, None),
                role_ref: role_ref("ClusterRole"),
                subjects: Some(vec![subject]),
            })?,
        ],
    };
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&d).context("rendering YAML")?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const TB: &str = "tinkerbell.org";
    const BMC: &str = "bmc.tinkerbell.org";
    const ALL_VERBS: &[&str] = &[
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "*",
    ];

    fn roles(tink: Mode, rufio: Mode) -> Roles {
        Roles {
            tink,
            rufio,
            zero_touch: false,
            metal3: false,
            cleaning: false,
        }
    }

    /// Every (group, resource, verb) the rules allow.
    fn allowed(rules: &[PolicyRule]) -> Vec<(String, String, String)> {
        let mut v = vec![];
        for r in rules {
            for g in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    for verb in &r.verbs {
                        v.push((g.clone(), res.clone(), verb.clone()));
                    }
                }
            }
        }
        v.sort();
        v
    }

    fn set(items: &[(&str, &[&str], &[&str])]) -> Vec<(String, String, String)> {
        let mut v = vec![];
        for (g, resources, verbs) in items {
            for r in *resources {
                for verb in *verbs {
                    v.push((g.to_string(), r.to_string(), verb.to_string()));
                }
            }
        }
        v.sort();
        v.dedup();
        v
    }

    /// The permissions of every mode: the read-only mirror, leases, events.
    fn base() -> Vec<(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    )> {
        vec![
            (
                TB,
                &["hardware", "templates", "workflows", "workflowrulesets"],
                READ,
            ),
            (BMC, &["machines", "jobs", "tasks"], READ),
            ("", &["secrets"], READ),
            (
                "coordination.k8s.io",
                &["leases"],
                &["get", "list", "watch", "create", "update", "patch"],
            ),
            ("", &["events"], &["create", "patch"]),
        ]
    }

    /// A table as `set` takes it.
    fn table(
        t: &[Grant],
    ) -> Vec<(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    )> {
        t.iter().map(|g| (g.group, g.resources, g.verbs)).collect()
    }

    #[test]
    fn external_external_only_reads_the_mirror_and_supervises() {
        let r = rules(roles(Mode::External, Mode::External));
        let mut want = base();
        want.extend(table(SUPERVISOR));
        assert_eq!(allowed(&r), set(&want));
        for (g, res, verb) in allowed(&r) {
            let write = !READ.contains(&verb.as_str());
            let supervisor = SUPERVISOR.iter().any(|s| {
                s.group == g
                    && s.resources.contains(&res.as_str())
                    && s.verbs.contains(&verb.as_str())
            });
            assert!(
                !write || res == "leases" || res == "events" || supervisor,
                "{g}/{res} {verb}"
            );
        }
        // Native both: nothing to supervise.
        assert!(!allows(
            &rules(Roles::default()),
            "apps",
            "deployments",
            "create"
        ));
    }

    #[test]
    fn zero_touch_adds_creating_hardware_and_workflows_only() {
        let plain = rules(Roles::default());
        let zero = rules(Roles {
            zero_touch: true,
            ..Roles::default()
        });
        for res in ["hardware", "workflows"] {
            assert!(!allows(&plain, TB, res, "create"), "{res}");
            assert!(allows(&zero, TB, res, "create"), "{res}");
            assert!(!allows(&zero, TB, res, "delete"), "{res}");
        }
        assert!(allows(&plain, TB, "workflowrulesets", "watch"));
        assert!(!allows(&zero, TB, "templates", "create"));
    }

    #[test]
    fn cleaning_adds_its_templates_and_workflows_and_no_more() {
        let plain = rules(Roles::default());
        let c = rules(Roles {
            cleaning: true,
            ..Roles::default()
        });
        for res in ["templates", "workflows"] {
            for verb in ["create", "delete", "patch"] {
                assert!(!allows(&plain, TB, res, verb), "{res} {verb}");
                assert!(allows(&c, TB, res, verb), "{res} {verb}");
            }
        }
        // The hold: Tink native's write on Hardware, no create or delete.
        assert!(allows(&c, TB, "hardware", "patch"));
        assert!(!allows(&c, TB, "hardware", "delete"));
    }

    #[test]
    fn metal3_adds_what_bmo_writes_and_the_hosts_parts() {
        let plain = rules(Roles::default());
        let m3 = rules(Roles {
            metal3: true,
            ..Roles::default()
        });
        const M3: &str = "metal3.io";
        for (res, verb) in [
            ("baremetalhosts", "watch"),
            ("baremetalhosts", "patch"),
            ("baremetalhosts/status", "patch"),
            ("baremetalhosts/finalizers", "update"),
            ("hardwaredata", "create"),
            ("hardwaredata", "delete"),
        ] {
            assert!(!allows(&plain, M3, res, verb), "{res} {verb}");
            assert!(allows(&m3, M3, res, verb), "{res} {verb}");
        }
        assert!(!allows(&m3, M3, "baremetalhosts", "create"), "the user's");
        assert!(!allows(&m3, M3, "baremetalhosts", "delete"), "the user's");
        for res in ["hardware", "templates", "workflows"] {
            assert!(allows(&m3, TB, res, "create"), "{res}");
            assert!(allows(&m3, TB, res, "delete"), "{res}");
        }
        assert!(allows(&m3, BMC, "machines", "create"));
        assert!(allows(&m3, "", "secrets", "create"));
        assert!(!allows(&m3, "", "secrets", "patch"), "never written over");
        assert!(!allows(&plain, "", "secrets", "create"));
        assert!(allows(&m3, BMC, "jobs", "delete"));
    }

    #[test]
    fn tink_native_adds_workflow_status_allowpxe_and_netboot_jobs() {
        let r = rules(roles(Mode::Native, Mode::External));
        let mut want = base();
        want.extend(table(SUPERVISOR));
        want.extend([
            (TB, &["workflows/status"][..], WRITE),
            (TB, &["hardware", "hardware/status"][..], WRITE),
            (BMC, &["jobs"][..], CREATE_DELETE),
        ]);
        assert_eq!(allowed(&r), set(&want));
        assert!(allows(&r, TB, "hardware", "patch"));
        assert!(!allows(&r, TB, "hardware", "create"), "nobody's");
        assert!(!allows(&r, BMC, "tasks", "create"), "rufio's");
        assert!(!allows(&r, BMC, "machines/status", "update"), "rufio's");
    }

    #[test]
    fn rufio_native_adds_bmc_status_tasks_and_finalizers() {
        let r = rules(roles(Mode::External, Mode::Native));
        let mut want = base();
        want.extend(table(SUPERVISOR));
        want.extend([
            (
                BMC,
                &["machines/status", "jobs/status", "tasks/status"][..],
                WRITE,
            ),
            (BMC, &["tasks"][..], CREATE_DELETE),
            (
                BMC,
                &["machines/finalizers", "jobs/finalizers", "tasks/finalizers"][..],
                &["update"][..],
            ),
            // The inventory: the Hardware's status, the Machine's annotation.
            (TB, &["hardware/status"][..], WRITE),
            (BMC, &["machines"][..], WRITE),
        ]);
        assert_eq!(allowed(&r), set(&want));
        assert!(!allows(&r, TB, "hardware", "patch"), "tink's");
        assert!(!allows(&r, BMC, "jobs", "create"), "tink's");
        // (workflows/status is the supervisor's too: a migration.)
    }

    #[test]
    fn native_native_is_the_union_and_reads_as_few_rules() {
        let r = rules(Roles::default());
        let mut want = base();
        want.extend(table(TINK_NATIVE));
        want.extend(table(RUFIO_NATIVE));
        let want = set(&want);
        assert_eq!(allowed(&r), want);
        // Nothing anywhere is a wildcard, deletes a collection, or touches
        // anything but the listed groups.
        for (g, res, verb) in allowed(&r) {
            assert!(!res.contains('*') && verb != "*" && verb != "deletecollection");
            assert!(["", TB, BMC, "coordination.k8s.io"].contains(&g.as_str()));
            assert!(ALL_VERBS.contains(&verb.as_str()));
        }
        // One rule per group and verb set, resources merged.
        let jobs_tasks = r
            .iter()
            .find(|p| p.resources.as_deref() == Some(&["jobs".into(), "tasks".into()][..]))
            .expect("jobs and tasks share their verbs");
        assert_eq!(
            jobs_tasks.verbs,
            ["get", "list", "watch", "create", "delete"]
        );
        assert_eq!(r.len(), 10, "{r:#?}");
    }

    fn docs(y: &str) -> Vec<Value> {
        serde_saphyr::from_multiple(y).unwrap()
    }

    #[test]
    fn cluster_wide_by_default() {
        let y = render(&Options::default()).unwrap();
        let d = docs(&y);
        let kinds: Vec<&str> = d.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
        );
        assert_eq!(d[0]["apiVersion"], "v1");
        assert_eq!(d[0]["metadata"]["namespace"], "tinkerbell");
        assert_eq!(d[0]["metadata"]["name"], "tinkerbox");
        assert_eq!(d[1]["apiVersion"], "rbac.authorization.k8s.io/v1");
        assert!(d[1]["metadata"].get("namespace").is_none());
        assert_eq!(d[2]["roleRef"]["kind"], "ClusterRole");
        assert_eq!(d[2]["roleRef"]["name"], "tinkerbox");
        assert_eq!(d[2]["subjects"][0]["namespace"], "tinkerbell");
        // The core group survives YAML as "", not as null.
        assert!(y.contains("- \"\"") || y.contains("- ''"), "{y}");
        // It reads back as the typed rules.
        let back: ClusterRole = serde_json::from_value(d[1].clone()).unwrap();
        assert_eq!(back.rules.unwrap(), rules(Roles::default()));
    }

    #[test]
    fn one_namespace_gets_a_role() {
        let o = Options {
            namespace: Some("lab".into()),
            service_account: "tb".into(),
            sa_namespace: "infra".into(),
            roles: roles(Mode::External, Mode::External),
        };
        let d = docs(&render(&o).unwrap());
        let kinds: Vec<&str> = d.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding"]);
        assert_eq!(d[0]["metadata"]["namespace"], "infra");
        assert_eq!(d[1]["metadata"]["namespace"], "lab");
        assert_eq!(d[2]["metadata"]["namespace"], "lab");
        assert_eq!(d[2]["roleRef"]["kind"], "Role");
        assert_eq!(d[2]["subjects"][0]["name"], "tb");
        assert_eq!(d[2]["subjects"][0]["namespace"], "infra");
        let back: Role = serde_json::from_value(d[1].clone()).unwrap();
        assert_eq!(back.rules.unwrap(), rules(o.roles));
        // An empty namespace is every namespace.
        let o = Options {
            namespace: Some(String::new()),
            ..o
        };
        assert_eq!(docs(&render(&o).unwrap())[1]["kind"], "ClusterRole");
    }

    #[test]
    fn bad_names_are_refused() {
        for (sa, ns) in [
            ("Tinkerbox", "tinkerbell"),
            ("tb", ""),
            ("tb", "a/b"),
            ("-x", "y"),
        ] {
            let o = Options {
                service_account: sa.into(),
                sa_namespace: ns.into(),
                ..Options::default()
            };
            assert!(render(&o).is_err(), "{sa} {ns}");
        }
        let o = Options {
            namespace: Some("UPPER".into()),
            ..Options::default()
        };
        assert!(render(&o).unwrap_err().to_string().contains("--namespace"));
    }
}
