//! What the pages show, pure: a machine's row (its lifecycle state from
//! its Hardware, Workflow and BMC), the filter a list is narrowed by, and
//! paging. The handlers read the store and hand the documents here.

use crate::bmc::PowerState;
use crate::events::Kind;
use crate::hardware::Key;
use crate::store::workflow::WorkflowRow;
use crate::workflow::model::State as WfState;
use serde_json::Value;

/// A machine's place in its life, as the machines page filters it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lifecycle {
    /// Made by discovery, no Workflow yet.
    Discovered,
    /// No Workflow under way, none succeeded or failed.
    Idle,
    /// A Workflow is under way.
    Installing,
    /// Its last Workflow succeeded.
    Installed,
    /// Its last Workflow failed or timed out.
    Failed,
    /// Held while its disks are wiped (`cleaning`).
    Cleaning,
}

impl Lifecycle {
    pub const ALL: [Lifecycle; 6] = [
        Lifecycle::Discovered,
        Lifecycle::Idle,
        Lifecycle::Installing,
        Lifecycle::Installed,
        Lifecycle::Failed,
        Lifecycle::Cleaning,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Discovered => "discovered",
            Lifecycle::Idle => "idle",
            Lifecycle::Installing => "installing",
            Lifecycle::Installed => "installed",
            Lifecycle::Failed => "failed",
            Lifecycle::Cleaning => "cleaning",
        }
    }

    pub fn parse(s: &str) -> Option<Lifecycle> {
        Lifecycle::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// A Workflow's progress: actions done of all, and the one running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub name: String,
    pub state: WfState,
    pub done: usize,
    pub total: usize,
    /// The running action and its last message (image MB/s, say).
    pub current: Option<(String, String)>,
}

impl Progress {
    pub fn of(w: &WorkflowRow) -> Progress {
        let actions = w.status.tasks.iter().flat_map(|t| &t.actions);
        let total = actions.clone().count();
        let done = actions
            .clone()
            .filter(|a| a.state == WfState::Success)
            .count();
        let current = actions
            .clone()
            .find(|a| a.state == WfState::Running)
            .map(|a| (a.name.clone(), a.message.clone().unwrap_or_default()));
        Progress {
            name: w.key.name.clone(),
            state: w.status.state,
            done,
            total,
            current,
        }
    }

    /// Percent done, for the bar.
    pub fn percent(&self) -> usize {
        match (self.state, self.total) {
            (WfState::Success, _) => 100,
            (_, 0) => 0,
            (_, t) => self.done * 100 / t,
        }
    }
}

/// One row of the machines page.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: Key,
    pub state: Lifecycle,
    pub power: Option<PowerState>,
    pub macs: Vec<String>,
    pub ips: Vec<String>,
    pub labels: Vec<(String, String)>,
    pub workflow: Option<Progress>,
    /// When it was last heard from (its newest event), ms since the epoch.
    pub last_heard_ms: Option<i64>,
    /// The document, for the label selector (shared with the list's cache).
    pub doc: std::sync::Arc<Value>,
}

fn under_way(s: WfState) -> bool {
    matches!(
        s,
        WfState::New | WfState::Preparing | WfState::Pending | WfState::Running | WfState::Post
    )
}

/// The machines per state, in [`Lifecycle::ALL`]'s order.
pub fn counts(rows: &[Row]) -> Vec<(&'static str, usize)> {
    Lifecycle::ALL
        .iter()
        .map(|l| (l.as_str(), rows.iter().filter(|r| r.state == *l).count()))
        .collect()
}

/// The Workflow a machine's row shows: one under way, else the newest
/// (by creation time, then name).
pub fn current_workflow<'a>(
    wfs: impl IntoIterator<Item = &'a WorkflowRow>,
) -> Option<&'a WorkflowRow> {
    let created = |w: &WorkflowRow| {
        w.doc
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    wfs.into_iter().max_by(|a, b| {
        (under_way(a.status.state), created(a), &a.key.name).cmp(&(
            under_way(b.status.state),
            created(b),
            &b.key.name,
        ))
    })
}

/// A Hardware's row, from its document, its current Workflow and its BMC
/// Machine's power.
pub fn row(
    doc: impl Into<std::sync::Arc<Value>>,
    workflow: Option<&WorkflowRow>,
    power: Option<PowerState>,
) -> Row {
    let doc = doc.into();
    let meta = &doc["metadata"];
    let key = Key::of(&doc);
    let labels: Vec<(String, String)> = meta["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    let ifaces = doc["spec"]["interfaces"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let macs = ifaces
        .iter()
        .filter_map(|i| i.pointer("/dhcp/mac").and_then(Value::as_str))
        .map(str::to_ascii_lowercase)
        .collect();
    let ips = ifaces
        .iter()
        .filter_map(|i| i.pointer("/dhcp/ip/address").and_then(Value::as_str))
        .map(String::from)
        .collect();
    let held =
        meta["labels"][crate::cleaning::OWNER_NAME].as_str() == Some(crate::cleaning::HOLDER);
    let discovered = meta["labels"]
        .get(crate::discovery::hardware::DISCOVERED_LABEL)
        .is_some();
    let progress = workflow.map(Progress::of);
    let state = match (&progress, held, discovered) {
        (_, true, _) => Lifecycle::Cleaning,
        (Some(p), _, _) if under_way(p.state) => Lifecycle::Installing,
        (Some(p), _, _) if p.state == WfState::Success => Lifecycle::Installed,
        (Some(_), _, _) => Lifecycle::Failed,
        (None, _, true) => Lifecycle::Discovered,
        (None, _, false) => Lifecycle::Idle,
    };
    Row {
        key,
        state,
        power,
        macs,
        ips,
        labels,
        workflow: progress,
        last_heard_ms: None,
        doc,
    }
}

/// The first 16 members of the array at `p` in `v` (none if it is not one).
fn list<'a>(v: &'a Value, p: &str) -> impl Iterator<Item = &'a Value> {
    v.pointer(p)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .take(16)
}

/// What the agent reported of a machine (upstream's attributes
/// annotation) and what its BMC's inventory says (Rufio's `outOfBand`),
/// as name/value lines.
pub fn facts(doc: &Value) -> Vec<(String, String)> {
    let mut out = vec![];
    let attrs = doc
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(crate::discovery::hardware::ATTRIBUTES_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    let text = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let product = |v: &Value| {
        format!(
            "{} {}",
            text(v, "/product/vendor"),
            text(v, "/product/name")
        )
        .trim()
        .to_string()
    };
    let mut push = |k: String, v: String| {
        if !v.is_empty() {
            out.push((k, v));
        }
    };
    if let Some(a) = &attrs {
        push("product".into(), product(a));
        push(
            "cpu".into(),
            a.pointer("/cpu/totalCores")
                .map(|c| format!("{c} cores"))
                .unwrap_or_default(),
        );
        push("memory".into(), text(a, "/memory/total"));
        for d in list(a, "/blockDevices") {
            push(
                format!("disk {}", text(d, "/name")),
                format!("{} {}", text(d, "/size"), text(d, "/model"))
                    .trim()
                    .to_string(),
            );
        }
        for n in list(a, "/networkInterfaces") {
            push(
                format!("nic {}", text(n, "/name")),
                format!("{} {}", text(n, "/mac"), text(n, "/speed"))
                    .trim()
                    .to_string(),
            );
        }
    }
    if let Some(o) = doc.pointer("/status/attributes/outOfBand") {
        push("BMC: product".into(), product(o));
        push(
            "BMC: cpu".into(),
            o.pointer("/cpu/totalCores")
                .map(|c| format!("{c} cores"))
                .unwrap_or_default(),
        );
        let disks = o
            .pointer("/blockDevices")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        push(
            "BMC: disks".into(),
            if disks > 0 {
                disks.to_string()
            } else {
                String::new()
            },
        );
    }
    out
}

/// A BareMetalHost's inspection (`status.hardware`, Metal3's
/// HardwareDetails) as the same name/value lines as [`facts`].
pub fn host_facts(hw: &Value) -> Vec<(String, String)> {
    let text = |v: &Value, p: &str| match v.pointer(p) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    let mut out = vec![];
    let mut push = |k: String, v: String| {
        let v = v.trim().to_string();
        if !v.is_empty() {
            out.push((k, v));
        }
    };
    push(
        "product".into(),
        format!(
            "{} {}",
            text(hw, "/systemVendor/manufacturer"),
            text(hw, "/systemVendor/productName")
        ),
    );
    push("serial".into(), text(hw, "/systemVendor/serialNumber"));
    push(
        "firmware".into(),
        format!(
            "{} {}",
            text(hw, "/firmware/bios/vendor"),
            text(hw, "/firmware/bios/version")
        ),
    );
    let count = text(hw, "/cpu/count");
    push(
        "cpu".into(),
        format!(
            "{}{} {}",
            if count.is_empty() {
                String::new()
            } else {
                format!("{count} × ")
            },
            text(hw, "/cpu/model"),
            text(hw, "/cpu/arch")
        ),
    );
    if let Some(m) = hw.pointer("/ramMebibytes").and_then(Value::as_u64) {
        push("memory".into(), format!("{:.1} GiB", m as f64 / 1024.0));
    }
    for d in list(hw, "/storage") {
        let size = d
            .pointer("/sizeBytes")
            .and_then(Value::as_u64)
            .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default();
        push(
            format!("disk {}", text(d, "/name")),
            format!("{size} {}", text(d, "/model")),
        );
    }
    for n in list(hw, "/nics") {
        push(
            format!("nic {}", text(n, "/name")),
            format!("{} {}", text(n, "/mac"), text(n, "/ip")),
        );
    }
    out
}

/// A stage of a machine's newest network boot, as its events tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    PowerOn,
    Dhcp,
    Tftp,
    Ipxe,
    Osie,
    Workflow,
    Finished,
    FromDisk,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::PowerOn => "power on",
            Stage::Dhcp => "DHCP",
            Stage::Tftp => "TFTP",
            Stage::Ipxe => "iPXE script",
            Stage::Osie => "OSIE",
            Stage::Workflow => "Workflow",
            Stage::Finished => "Workflow done",
            Stage::FromDisk => "installed system",
        }
    }
}

/// One event, as [`stages`] reads it.
pub struct BootEvent {
    pub kind: Kind,
    pub ms: i64,
    /// `workflow.state`: the state it went to.
    pub to: Option<String>,
}

/// A stage, when it began, and how long until the next one began.
#[derive(Debug, PartialEq)]
pub struct StageTime {
    pub stage: Stage,
    pub at_ms: i64,
    pub took_ms: Option<i64>,
}

/// The stages of the newest network boot in `events` (oldest first): it
/// is anchored on the last iPXE script served; before it the TFTP
/// transfer, the firmware's DHCP exchange and the BMC's power-on; after
/// it the OSIE's first download, the Workflow's first action, its end,
/// and the installed system's first metadata read or syslog line.
pub fn stages(events: &[BootEvent]) -> Vec<StageTime> {
    use Kind as K;
    let Some(a) = events.iter().rposition(|e| e.kind == K::IpxeScript) else {
        return vec![];
    };
    let dhcp = |k: K| {
        matches!(
            k,
            K::DhcpOffer | K::DhcpAck | K::DhcpProxyOffer | K::DhcpProxyAck | K::DiscoveryLease
        )
    };
    let last_before =
        |end: usize, f: &dyn Fn(K) -> bool| events[..end].iter().rposition(|e| f(e.kind));
    let first_after = |start: usize, f: &dyn Fn(&BootEvent) -> bool| {
        events
            .get(start..)
            .and_then(|rest| rest.iter().position(f))
            .map(|i| start + i)
    };
    let mut found: Vec<(Stage, usize)> = vec![];
    let tftp = last_before(a, &|k| k == K::TftpSent);
    // The exchange's first packet: back over the run of DHCP events.
    let dhcp_at = last_before(tftp.unwrap_or(a), &dhcp).map(|mut i| {
        while i > 0 && dhcp(events[i - 1].kind) {
            i -= 1;
        }
        i
    });
    if let Some(d) = dhcp_at
        && let Some(p) = last_before(d, &|k| matches!(k, K::BmcNetboot | K::BmcPower))
    {
        found.push((Stage::PowerOn, p));
    }
    found.extend(dhcp_at.map(|d| (Stage::Dhcp, d)));
    found.extend(tftp.map(|t| (Stage::Tftp, t)));
    found.push((Stage::Ipxe, a));
    found.extend(first_after(a + 1, &|e| e.kind == K::HttpArtifact).map(|i| (Stage::Osie, i)));
    let wf = first_after(a + 1, &|e| e.kind == K::WorkflowActionStarted);
    found.extend(wf.map(|i| (Stage::Workflow, i)));
    let done = wf.and_then(|w| {
        first_after(w, &|e| {
            e.kind == K::WorkflowState
                && matches!(e.to.as_deref(), Some("SUCCESS" | "FAILED" | "TIMEOUT"))
        })
    });
    found.extend(done.map(|i| (Stage::Finished, i)));
    if let Some(d) = done {
        found.extend(
            first_after(d + 1, &|e| matches!(e.kind, K::MetadataRead | K::Syslog))
                .map(|i| (Stage::FromDisk, i)),
        );
    }
    let mut out: Vec<StageTime> = vec![];
    for (stage, i) in found {
        let at_ms = events[i].ms;
        if out.last().is_some_and(|l| l.at_ms > at_ms) {
            continue;
        }
        if let Some(l) = out.last_mut() {
            l.took_ms = Some(at_ms - l.at_ms);
        }
        out.push(StageTime {
            stage,
            at_ms,
            took_ms: None,
        });
    }
    out
}

/// What a list is narrowed to.
#[derive(Debug, Default)]
pub struct Filter {
    /// Case-insensitive text in the name, namespace, a MAC or an IP.
    pub text: String,
    pub state: Option<Lifecycle>,
    pub selector: Option<kube::core::Selector>,
}

impl Filter {
    pub fn keeps(&self, r: &Row) -> bool {
        if self.state.is_some_and(|s| s != r.state) {
            return false;
        }
        if let Some(sel) = &self.selector
            && !crate::labels::selects(sel, &r.doc)
        {
            return false;
        }
        let t = self.text.trim().to_ascii_lowercase();
        t.is_empty()
            || r.key.name.to_ascii_lowercase().contains(&t)
            || r.key.namespace.to_ascii_lowercase().contains(&t)
            || r.macs.iter().any(|m| m.contains(&t))
            || r.ips.iter().any(|i| i.contains(&t))
    }
}

/// Page `page` (from 1) of `per` items: the range, and how many pages.
pub fn page_range(len: usize, per: usize, page: usize) -> (std::ops::Range<usize>, usize) {
    let per = per.max(1);
    let pages = len.div_ceil(per).max(1);
    let page = page.clamp(1, pages);
    let start = (page - 1) * per;
    (start..(start + per).min(len), pages)
}

/// "3 s ago", "5 min ago", "2 h ago", "4 d ago".
pub fn ago(then_ms: i64, now_ms: i64) -> String {
    let s = (now_ms - then_ms).max(0) / 1000;
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::model::{Action, Status, Task};
    use serde_json::json;

    fn hw(name: &str, labels: Value) -> Value {
        json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
               "metadata": {"name": name, "namespace": "lab", "labels": labels},
               "spec": {"interfaces": [{"dhcp": {"mac": "52:54:00:AA:00:01", "ip": {"address": "10.0.0.5"}}}]}})
    }

    fn wf(name: &str, created: &str, state: WfState, actions: &[(&str, WfState)]) -> WorkflowRow {
        WorkflowRow {
            key: Key::new("lab", name),
            doc: json!({"metadata": {"name": name, "creationTimestamp": created}}),
            status: Status {
                state,
                tasks: vec![Task {
                    actions: actions
                        .iter()
                        .map(|(n, s)| Action {
                            name: n.to_string(),
                            state: *s,
                            message: Some(format!("{n} at 40 MB/s")),
                            ..Action::default()
                        })
                        .collect(),
                    ..Task::default()
                }],
                ..Status::default()
            },
            version: 1,
        }
    }

    #[test]
    fn the_state_comes_from_the_hold_the_workflow_and_discovery() {
        let running = wf(
            "w2",
            "2026-01-02T00:00:00Z",
            WfState::Running,
            &[
                ("stream", WfState::Success),
                ("cloud-init", WfState::Running),
                ("reboot", WfState::Pending),
            ],
        );
        let old = wf("w1", "2026-01-03T00:00:00Z", WfState::Success, &[]);
        // The running one wins over a newer finished one.
        let cur = current_workflow([&old, &running]).unwrap();
        assert_eq!(cur.key.name, "w2");
        let r = row(hw("m1", json!({})), Some(cur), Some(PowerState::On));
        assert_eq!(r.state, Lifecycle::Installing);
        let p = r.workflow.as_ref().unwrap();
        assert_eq!((p.done, p.total, p.percent()), (1, 3, 33));
        assert_eq!(
            p.current,
            Some(("cloud-init".into(), "cloud-init at 40 MB/s".into()))
        );
        assert_eq!(r.macs, ["52:54:00:aa:00:01"]);
        assert_eq!(r.ips, ["10.0.0.5"]);
        assert_eq!(
            row(hw("m", json!({})), Some(&old), None).state,
            Lifecycle::Installed
        );
        let failed = wf("w3", "", WfState::Timeout, &[]);
        assert_eq!(
            row(hw("m", json!({})), Some(&failed), None).state,
            Lifecycle::Failed
        );
        let d = hw("m", json!({"tinkerbell.org/auto-discovered": "true"}));
        assert_eq!(row(d, None, None).state, Lifecycle::Discovered);
        assert_eq!(row(hw("m", json!({})), None, None).state, Lifecycle::Idle);
        let held = hw(
            "m",
            json!({"v1alpha1.tinkerbell.org/ownerName": "tinkerbox_cleaning"}),
        );
        assert_eq!(row(held, Some(&running), None).state, Lifecycle::Cleaning);
        // Newest of the finished, by creation time.
        let newer = wf("a", "2026-02-01T00:00:00Z", WfState::Failed, &[]);
        assert_eq!(current_workflow([&newer, &old]).unwrap().key.name, "a");
        assert!(current_workflow([]).is_none());
    }

    #[test]
    fn the_filter_matches_text_state_and_labels() {
        let r = row(hw("web-01", json!({"rack": "r1"})), None, None);
        let f = |text: &str, state: Option<Lifecycle>, sel: Option<&str>| Filter {
            text: text.into(),
            state,
            selector: sel.map(|s| crate::labels::parse(s).unwrap()),
        };
        assert!(f("", None, None).keeps(&r));
        assert!(f("WEB", None, None).keeps(&r));
        assert!(f("aa:00:01", None, None).keeps(&r));
        assert!(f("10.0.0.5", None, None).keeps(&r));
        assert!(f("lab", None, None).keeps(&r));
        assert!(!f("db", None, None).keeps(&r));
        assert!(f("", Some(Lifecycle::Idle), None).keeps(&r));
        assert!(!f("", Some(Lifecycle::Failed), None).keeps(&r));
        assert!(f("", None, Some("rack=r1")).keeps(&r));
        assert!(!f("", None, Some("rack in (r2)")).keeps(&r));
        for l in Lifecycle::ALL {
            assert_eq!(Lifecycle::parse(l.as_str()), Some(l));
        }
    }

    #[test]
    fn a_boot_s_stages_come_from_its_events() {
        let ev = |kind: Kind, s: i64| BootEvent {
            kind,
            ms: s * 1000,
            to: None,
        };
        let state = |to: &str, s: i64| BootEvent {
            kind: Kind::WorkflowState,
            ms: s * 1000,
            to: Some(to.into()),
        };
        use Kind as K;
        let events = vec![
            // An earlier boot, then the newest.
            ev(K::DhcpOffer, 1),
            ev(K::IpxeScript, 2),
            ev(K::BmcNetboot, 100),
            ev(K::DhcpOffer, 103),
            ev(K::DhcpAck, 104),
            ev(K::TftpSent, 105),
            ev(K::DhcpAck, 106),
            ev(K::IpxeScript, 107),
            ev(K::HttpArtifact, 108),
            ev(K::Syslog, 115),
            ev(K::WorkflowActionStarted, 120),
            state("RUNNING", 120),
            ev(K::WorkflowActionSucceeded, 150),
            state("SUCCESS", 151),
            ev(K::DhcpAck, 170),
            ev(K::MetadataRead, 175),
        ];
        let got: Vec<(Stage, i64, Option<i64>)> = stages(&events)
            .iter()
            .map(|s| (s.stage, s.at_ms / 1000, s.took_ms.map(|t| t / 1000)))
            .collect();
        assert_eq!(
            got,
            vec![
                (Stage::PowerOn, 100, Some(3)),
                (Stage::Dhcp, 103, Some(2)),
                (Stage::Tftp, 105, Some(2)),
                (Stage::Ipxe, 107, Some(1)),
                (Stage::Osie, 108, Some(12)),
                (Stage::Workflow, 120, Some(31)),
                (Stage::Finished, 151, Some(24)),
                (Stage::FromDisk, 175, None),
            ]
        );
        // Under way: what has happened so far; no boot: nothing.
        assert_eq!(stages(&events[..9]).len(), 5);
        assert!(stages(&events[..1]).is_empty());
    }

    #[test]
    fn a_host_s_inspection_reads_as_facts() {
        let hw = serde_json::json!({
            "systemVendor": {"manufacturer": "QEMU", "productName": "Standard PC (Q35)", "serialNumber": ""},
            "firmware": {"bios": {"vendor": "EFI Development Kit II / OVMF", "version": "0.0.0"}},
            "cpu": {"arch": "x86_64", "model": "QEMU Virtual CPU", "count": 2},
            "ramMebibytes": 2048,
            "storage": [{"name": "/dev/vda", "sizeBytes": 5368709120u64, "model": ""}],
            "nics": [{"name": "enp0s3", "mac": "52:54:00:12:34:56", "ip": "10.9.0.20"}],
        });
        let f = host_facts(&hw);
        let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("product"), Some("QEMU Standard PC (Q35)"));
        assert_eq!(get("serial"), None, "empty values are left out");
        assert_eq!(get("cpu"), Some("2 × QEMU Virtual CPU x86_64"));
        assert_eq!(get("memory"), Some("2.0 GiB"));
        assert_eq!(get("disk /dev/vda"), Some("5.0 GiB"));
        assert_eq!(get("nic enp0s3"), Some("52:54:00:12:34:56 10.9.0.20"));
        assert!(host_facts(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn facts_come_from_the_agent_and_the_bmc() {
        let mut d = hw("m", json!({}));
        assert!(facts(&d).is_empty());
        let attrs = json!({"product": {"vendor": "QEMU", "name": "Standard PC"}, "cpu": {"totalCores": 2},
                           "memory": {"total": "2 GiB"}, "blockDevices": [{"name": "vda", "size": "5 GiB"}],
                           "networkInterfaces": [{"name": "eth0", "mac": "52:54:00:aa:00:01"}]});
        d["metadata"]["annotations"] =
            json!({"tinkerbell.org/agent-attributes": attrs.to_string()});
        d["status"] = json!({"attributes": {"outOfBand": {"product": {"vendor": "Dell", "name": "R640"},
                                                          "blockDevices": [{}, {}]}}});
        let f = facts(&d);
        let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("product"), Some("QEMU Standard PC"));
        assert_eq!(get("cpu"), Some("2 cores"));
        assert_eq!(get("memory"), Some("2 GiB"));
        assert_eq!(get("disk vda"), Some("5 GiB"));
        assert_eq!(get("nic eth0"), Some("52:54:00:aa:00:01"));
        assert_eq!(get("BMC: product"), Some("Dell R640"));
        assert_eq!(get("BMC: disks"), Some("2"));
        assert_eq!(get("BMC: cpu"), None);
    }

    #[test]
    fn pages_and_times() {
        assert_eq!(page_range(0, 100, 1), (0..0, 1));
        assert_eq!(page_range(250, 100, 3), (200..250, 3));
        assert_eq!(page_range(250, 100, 9), (200..250, 3));
        assert_eq!(page_range(250, 100, 0), (0..100, 3));
        assert_eq!(ago(0, 59_000), "59 s ago");
        assert_eq!(ago(0, 61_000), "1 min ago");
        assert_eq!(ago(0, 7_200_000), "2 h ago");
        assert_eq!(ago(0, 3 * 86_400_000), "3 d ago");
        assert_eq!(ago(10, 0), "0 s ago");
    }
}
