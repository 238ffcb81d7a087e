//! Label selectors as kubectl takes them (`-l`, `?labelSelector=`):
//! `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, joined
//! by commas. Matching is kube-core's `Selector`; the string grammar is
//! hand-written because kube-core parses only the typed `LabelSelector`,
//! not the text form (apimachinery's `labels.Parse` has no Rust crate).

use kube::core::{Expression, Selector, SelectorExt};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Parse a selector; an empty string selects everything.
pub fn parse(s: &str) -> Result<Selector, String> {
    let mut exprs = vec![];
    for part in split_top(s)? {
        let p = part.trim();
        if p.is_empty() {
            continue;
        }
        exprs.push(expression(p).map_err(|m| format!("label selector {s:?}: {m}"))?);
    }
    Ok(Selector::from_iter(exprs))
}

/// Split at the commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut out, mut depth, mut start) = (vec![], 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("label selector {s:?}: unbalanced parentheses"));
        }
    }
    if depth != 0 {
        return Err(format!("label selector {s:?}: unbalanced parentheses"));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn expression(p: &str) -> Result<Expression, String> {
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key(k)?));
    }
    for (op, not) in [(" notin ", true), (" in ", false)] {
        if let Some((k, rest)) = p.split_once(op) {
            let set = values(rest)?;
            let k = key(k)?;
            return Ok(if not {
                Expression::NotIn(k, set)
            } else {
                Expression::In(k, set)
            });
        }
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Expression::NotEqual(key(k)?, value(v)?));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Ok(Expression::Equal(key(k)?, value(v)?));
    }
    Ok(Expression::Exists(key(p)?))
}

fn values(rest: &str) -> Result<BTreeSet<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("want a list in parentheses, got {:?}", rest.trim()))?;
    inner.split(',').map(value).collect()
}

/// A label key: an optional DNS-subdomain prefix and '/', then a name of
/// at most 63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    let name = k.rsplit_once('/').map_or(k, |(_, n)| n);
    if name.is_empty() || name.len() > 63 || value(name)? != name {
        return Err(format!("{k:?} is not a label key"));
    }
    Ok(k.to_string())
}

fn value(v: &str) -> Result<String, String> {
    let v = v.trim();
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if v.len() > 63 || !v.chars().all(ok_char) || !ends(v.chars().next()) || !ends(v.chars().last())
    {
        return Err(format!("{v:?} is not a label value"));
    }
    Ok(v.to_string())
}

/// Whether a document's `metadata.labels` satisfy `sel`.
pub fn selects(sel: &Selector, doc: &Value) -> bool {
    let labels: BTreeMap<String, String> = doc
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    sel.matches(&labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubectl_selectors() {
        let doc = json!({"metadata": {"labels": {
            "tinkerbell.org/auto-discovered": "true", "tinkerbox.io/cpu-cores": "4", "plan": "NUC"}}});
        let hit = |s: &str| selects(&parse(s).unwrap(), &doc);
        assert!(hit(""));
        assert!(hit("tinkerbell.org/auto-discovered=true"));
        assert!(hit("tinkerbell.org/auto-discovered==true,plan=NUC"));
        assert!(!hit("tinkerbell.org/auto-discovered=true,plan=Dell"));
        assert!(hit("plan!=Dell"));
        assert!(hit("plan"));
        assert!(hit("!missing"));
        assert!(!hit("!plan"));
        assert!(hit("tinkerbox.io/cpu-cores in (2,4, 8)"));
        assert!(!hit("tinkerbox.io/cpu-cores notin (4)"));
        assert!(hit("missing notin (x)"));
        assert!(!selects(&parse("plan").unwrap(), &json!({"metadata": {}})));
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        for bad in ["a in b", "a in (b", "=x", "a=b c", "a=(", "-a=b", "a/=b"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("label selector"), "{bad}: {e}");
        }
    }
}
