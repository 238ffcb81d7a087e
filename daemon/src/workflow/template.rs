//! A Template's `spec.data` once rendered: Tink's template document
//! (`version`, `name`, `global_timeout`, `tasks[].actions[]`), parsed and
//! checked by the rules tink-controller applies before a Workflow runs.
//!
//! Parsed as Go's yaml.v3 would parse it into Tink's structs: unknown
//! fields are ignored, and a scalar where a string is wanted keeps its
//! literal text (`MODE: 0600` is `"0600"`, `COMPRESSED: true` is `"true"`),
//! which is what the action images read from their environment.

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// The rendered template document.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Document {
    #[serde(default, deserialize_with = "text")]
    pub version: String,
    #[serde(default, deserialize_with = "text")]
    pub name: String,
    /// Seconds for the whole workflow; 0: none.
    #[serde(default)]
    pub global_timeout: i64,
    #[serde(default, deserialize_with = "list")]
    pub tasks: Vec<Task>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Task {
    #[serde(default, deserialize_with = "text")]
    pub name: String,
    /// The agent that runs the task: a Hardware's `spec.agentID` or MAC.
    #[serde(default, deserialize_with = "text")]
    pub worker: String,
    #[serde(default, deserialize_with = "list")]
    pub volumes: Vec<String>,
    #[serde(default, deserialize_with = "env")]
    pub environment: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "list")]
    pub actions: Vec<Action>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Action {
    #[serde(default, deserialize_with = "text")]
    pub name: String,
    #[serde(default, deserialize_with = "text")]
    pub image: String,
    /// Seconds; enforced by the agent.
    #[serde(default)]
    pub timeout: i64,
    #[serde(default, deserialize_with = "list")]
    pub command: Vec<String>,
    #[serde(default, deserialize_with = "list")]
    pub volumes: Vec<String>,
    #[serde(default, deserialize_with = "env")]
    pub environment: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "text")]
    pub pid: String,
    #[serde(default)]
    pub namespaces: Option<Namespaces>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, serde::Serialize)]
pub struct Namespaces {
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub network: String,
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub pid: String,
}

/// `null` is the empty string, as yaml.v3 leaves a Go string unset.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn env<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let m = Option::<BTreeMap<String, Option<String>>>::deserialize(d)?.unwrap_or_default();
    Ok(m.into_iter()
        .map(|(k, v)| (k, v.unwrap_or_default()))
        .collect())
}

/// Largest rendered document accepted, as tink-controller caps it.
pub const MAX_RENDERED: usize = 256 * 1024;

/// Parse a rendered document and check it. The message says what is
/// wrong and where (`tasks[0].actions[2].image: required`).
pub fn parse(rendered: &str) -> Result<Document, String> {
    if rendered.len() > MAX_RENDERED {
        return Err(format!(
            "rendered template is {} bytes, more than the {MAX_RENDERED} allowed",
            rendered.len()
        ));
    }
    let doc: Document = serde_saphyr::from_str(rendered)
        .map_err(|e| format!("rendered template is not valid YAML: {e}"))?;
    validate(&doc)?;
    Ok(doc)
}

/// tink-controller's rules (`template_validator.go`): names of 1-199
/// bytes, at least one task, task names unique, action names unique within
/// their task, every image a valid container image reference, and every
/// task's worker rendered non-empty. A negative timeout is refused too
/// (Go would wrap it into a huge unsigned one).
pub fn validate(doc: &Document) -> Result<(), String> {
    let length = |at: &str, name: &str| {
        if name.is_empty() || name.len() >= 200 {
            Err(format!(
                "{at}name: must be 1-199 bytes, got {} ({name:?})",
                name.len()
            ))
        } else {
            Ok(())
        }
    };
    length("", &doc.name)?;
    if doc.global_timeout < 0 {
        return Err(format!(
            "global_timeout: must not be negative, got {}",
            doc.global_timeout
        ));
    }
    if doc.tasks.is_empty() {
        return Err("tasks: at least one task is required".into());
    }
    let mut task_names = std::collections::HashSet::new();
    for (t, task) in doc.tasks.iter().enumerate() {
        let at = format!("tasks[{t}].");
        length(&at, &task.name)?;
        if !task_names.insert(task.name.as_str()) {
            return Err(format!("{at}name: {:?} is used by another task", task.name));
        }
        if task.worker.trim().is_empty() {
            return Err(format!("{at}worker: required (it rendered empty)"));
        }
        let mut action_names = std::collections::HashSet::new();
        for (a, action) in task.actions.iter().enumerate() {
            let at = format!("{at}actions[{a}].");
            length(&at, &action.name)?;
            if !action_names.insert(action.name.as_str()) {
                return Err(format!(
                    "{at}name: {:?} is used by another action of the task",
                    action.name
                ));
            }
            image_reference(&action.image).map_err(|e| {
                format!(
                    "{at}image: {:?} is not an image reference: {e}",
                    action.image
                )
            })?;
            if action.timeout < 0 {
                return Err(format!(
                    "{at}timeout: must not be negative, got {}",
                    action.timeout
                ));
            }
        }
    }
    Ok(())
}

/// A container image reference as Docker's `reference.ParseNormalizedNamed`
/// accepts it: `[domain[:port]/]path[:tag][@digest]`, the path lowercase.
/// Hand-written: the OCI crates that parse references pull in a registry
/// client; this grammar is 30 lines.
pub fn image_reference(r: &str) -> Result<(), &'static str> {
    if r.is_empty() {
        return Err("empty");
    }
    if r.len() > 255 + 128 + 80 {
        return Err("too long");
    }
    let (rest, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let (alg, hex) = d.split_once(':').ok_or("digest without algorithm")?;
        let alg_ok = !alg.is_empty()
            && alg.split(['+', '.', '_', '-']).all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        if !alg_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("invalid digest");
        }
    }
    // A tag follows the last ':' that comes after the last '/'.
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let mut b = t.bytes();
        let first = b.next().ok_or("empty tag")?;
        if t.len() > 128
            || !(first.is_ascii_alphanumeric() || first == b'_')
            || !b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
        {
            return Err("invalid tag");
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // Docker's rule: the first part is a domain if it has a '.' or a ':' or
    // is "localhost" (or has an uppercase letter), and there is more.
    if parts.len() > 1
        && (parts[0].contains(['.', ':'])
            || parts[0] == "localhost"
            || parts[0].bytes().any(|b| b.is_ascii_uppercase()))
    {
        let domain = parts.remove(0);
        let (host, port) = match domain.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || domain.starts_with('[') => (h, Some(p)),
            _ => (domain, None),
        };
        if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
            return Err("invalid registry port");
        }
        let host_ok = (host.starts_with('[') && host.ends_with(']'))
            || host.split('.').all(|l| {
                !l.is_empty()
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !host_ok {
            return Err("invalid registry host");
        }
    }
    if name.len() > 255 {
        return Err("name longer than 255 characters");
    }
    for p in &parts {
        // [a-z0-9]+ joined by '.', '_', '__' or runs of '-'.
        let ok = !p.is_empty()
            && p.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
            && p.starts_with(|c: char| c.is_ascii_alphanumeric())
            && p.ends_with(|c: char| c.is_ascii_alphanumeric())
            && !p.contains("..")
            && !p.contains("___")
            && !p.contains("._")
            && !p.contains("_.")
            && !p.contains(".-")
            && !p.contains("-.")
            && !p.contains("_-")
            && !p.contains("-_");
        if !ok {
            return Err(if p.bytes().any(|b| b.is_ascii_uppercase()) {
                "repository name must be lowercase"
            } else {
                "invalid repository name"
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"
version: "0.1"
name: t
global_timeout: 600
tasks:
  - name: install
    worker: "02:00:00:00:00:01"
    volumes: [/dev:/dev]
    environment: {A: 1}
    actions:
      - name: stream
        image: quay.io/tinkerbell/actions/image2disk
        timeout: 60
        environment:
          MODE: 0600
          COMPRESSED: true
          EMPTY: null
        on-timeout: [echo]
        unknown: ignored
"#;

    #[test]
    fn scalars_keep_their_literal_text() {
        let d = parse(DOC).unwrap();
        let env = &d.tasks[0].actions[0].environment;
        assert_eq!(env["MODE"], "0600");
        assert_eq!(env["COMPRESSED"], "true");
        assert_eq!(env["EMPTY"], "");
        assert_eq!(d.tasks[0].environment["A"], "1");
        assert_eq!(d.global_timeout, 600);
    }

    #[test]
    fn the_rules_name_the_field() {
        let cases = [
            ("name: \"\"", "name: must be 1-199"),
            (
                "name: t\ntasks: [{name: a, worker: w, actions: [{name: x, image: Bad/Image}]}]",
                "must be lowercase",
            ),
            ("name: t", "tasks: at least one"),
            (
                "name: t\ntasks: [{name: a, worker: ' ', actions: [{name: x, image: i}]}]",
                "tasks[0].worker: required",
            ),
            (
                "name: t\ntasks: [{name: a, worker: w, actions: [{name: x, image: i}]}, {name: a, worker: w, actions: [{name: x, image: i}]}]",
                "tasks[1].name: \"a\" is used",
            ),
            (
                "name: t\ntasks: [{name: a, worker: w, actions: [{name: x, image: i}, {name: x, image: i}]}]",
                "tasks[0].actions[1].name: \"x\" is used",
            ),
            (
                "name: t\ntasks: [{name: a, worker: w, actions: [{name: x}]}]",
                "tasks[0].actions[0].image: \"\" is not an image reference: empty",
            ),
            (
                "name: t\ntasks: [{name: a, worker: w, actions: [{name: x, image: i, timeout: -1}]}]",
                "timeout: must not be negative",
            ),
            ("name: [t", "not valid YAML"),
        ];
        for (doc, want) in cases {
            let e = parse(doc).unwrap_err();
            assert!(e.contains(want), "{doc}: {e}");
        }
        let long = format!("name: {}\n", "x".repeat(MAX_RENDERED));
        assert!(
            parse(&long)
                .unwrap_err()
                .contains("more than the 262144 allowed")
        );
    }

    #[test]
    fn image_references_as_docker_reads_them() {
        for ok in [
            "bash",
            "quay.io/tinkerbell/actions/oci2disk",
            "quay.io/tinkerbell-actions/image2disk:v1.0.0",
            "ghcr.io/jacobweinstock/waitdaemon:latest",
            "10.99.0.1:5000/capt/ubuntu:2404-amd64.gz",
            "localhost/a_b__c/d-e---f:T_1.x",
            "registry.example.com/x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(image_reference(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Bash",
            "a//b",
            "a:",
            "a:-x",
            "-a",
            "a..b",
            "a@sha256:xyz",
            "quay.io/A/b",
            "a b",
        ] {
            assert!(image_reference(bad).is_err(), "{bad}");
        }
    }
}
