//! Reading a YAML or JSON stream into documents, the way `kubectl apply -f`
//! reads a file: `---`-separated documents, a top-level YAML list (the
//! format of Tinkerbell's file backend), or a `kind: List`/`HardwareList`
//! with `items`; each document with the line it starts on, so that an error
//! can say where it is.

use super::FieldError;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use serde_saphyr::Spanned;

/// One document of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    /// 1-based line of the stream where it starts.
    pub line: u64,
    pub doc: Value,
}

/// Parser limits, scaled to the input: YAML's own defaults (1,024
/// documents, a million events) are for configuration files, not for an
/// inventory of thousands of machines. Every event costs at least a byte
/// of input, so limits proportional to the length still stop an alias or
/// nesting bomb; the request body limit bounds the length.
fn options(text: &str) -> serde_saphyr::Options {
    let n = text.len();
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = n / 3 + 16;
    budget.max_events = budget.max_events.max(2 * n + 1024);
    budget.max_nodes = budget.max_nodes.max(n + 1024);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// A top-level document: its items when it is a list (or a `kind: *List`),
/// each with its line.
enum Top {
    Items(Vec<Spanned<Value>>),
    One(Value),
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Top, D::Error> {
        d.deserialize_any(TopVisitor { in_items: false })
    }
}

/// Builds a [`Top`]; inside a mapping's `items`, a sequence keeps its
/// elements' lines and anything else becomes a plain value.
struct TopVisitor {
    in_items: bool,
}

struct Items(Top);

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Items, D::Error> {
        d.deserialize_any(TopVisitor { in_items: true }).map(Items)
    }
}

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML or JSON document")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element::<Spanned<Value>>()? {
            items.push(v);
        }
        Ok(Top::Items(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut obj = Map::new();
        let mut items = None;
        while let Some(k) = map.next_key::<String>()? {
            if k == "items" && !self.in_items {
                match map.next_value::<Items>()?.0 {
                    Top::Items(list) => {
                        obj.insert(k, Value::Array(vec![]));
                        items = Some(list);
                    }
                    Top::One(v) => {
                        obj.insert(k, v);
                    }
                }
            } else {
                obj.insert(k, map.next_value()?);
            }
        }
        let is_list = obj
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"));
        match items {
            Some(list) if is_list => Ok(Top::Items(list)),
            Some(list) => {
                let values = list.into_iter().map(|s| s.value).collect();
                obj.insert("items".into(), Value::Array(values));
                Ok(Top::One(Value::Object(obj)))
            }
            None => Ok(Top::One(Value::Object(obj))),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Top, E> {
        Ok(Top::One(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Top, E> {
        Ok(Top::One(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Top, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Top, E> {
        Ok(Top::One(Value::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Top, E> {
        Ok(Top::One(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Top, E> {
        Ok(Top::One(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Top, E> {
        Ok(Top::One(v.into()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Top, E> {
        Ok(Top::One(Value::String(v.into())))
    }
}

/// Every document of a stream, lists flattened into their items, each with
/// its line. A syntax error says where, in plain words.
pub fn parse_located(text: &str) -> Result<Vec<Located>, FieldError> {
    let docs: Vec<Spanned<Top>> = serde_saphyr::from_multiple_with_options(text, options(text))
        .map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(" at line {}, column {}", l.line(), l.column()))
                .unwrap_or_default();
            FieldError::new(
                "",
                format!("malformed YAML/JSON{at}: {}", first_line(&e.to_string())),
            )
        })?;
    let mut out = Vec::new();
    for d in docs {
        match d.value {
            Top::One(Value::Null) => {}
            Top::One(doc) => out.push(Located {
                line: d.referenced.line(),
                doc,
            }),
            Top::Items(items) => out.extend(items.into_iter().map(|s| Located {
                line: s.referenced.line(),
                doc: s.value,
            })),
        }
    }
    Ok(out)
}

/// [`parse_located`] without the lines.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, FieldError> {
    Ok(parse_located(text)?.into_iter().map(|l| l.doc).collect())
}

fn first_line(s: &str) -> String {
    s.lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Flatten a JSON body (a document, an array or a `kind: *List`) into its
/// documents.
pub fn expand_lists(doc: Value) -> Vec<Value> {
    match doc {
        Value::Null => vec![],
        Value::Array(items) => items,
        Value::Object(mut m)
            if m.get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
                && m.get("items").is_some_and(Value::is_array) =>
        {
            match m.remove("items") {
                Some(Value::Array(items)) => items,
                _ => vec![],
            }
        }
        other => vec![other],
    }
}

/// A document's place in a stream, for errors: `document 3 (line 41)`.
pub fn place(index: usize, line: Option<u64>) -> String {
    match line {
        Some(l) => format!("document {} (line {l})", index + 1),
        None => format!("document {}", index + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lists_and_streams_with_lines() {
        let text = "- apiVersion: a\n  kind: Hardware\n- kind: Hardware\n---\nkind: HardwareList\nitems:\n- {kind: Hardware}\n---\n---\nkind: Hardware\nitems: [1]\n";
        let docs = parse_located(text).unwrap();
        let lines: Vec<u64> = docs.iter().map(|d| d.line).collect();
        assert_eq!(lines, [1, 3, 7, 10]);
        assert_eq!(docs[3].doc["items"], serde_json::json!([1]));
        assert_eq!(
            parse_documents("{\"kind\": \"Hardware\"}").unwrap().len(),
            1
        );
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = parse_documents("a: 1\n---\nb: [unclosed\n").unwrap_err();
        assert!(
            e.message.starts_with("malformed YAML/JSON at line 3"),
            "{}",
            e.message
        );
    }

    /// YAML's default budget refused the 1,025th document of a stream.
    #[test]
    fn thousands_of_documents_parse() {
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!(
                "---\napiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {{name: m{i}}}\nspec:\n  interfaces:\n  - dhcp: {{mac: \"02:00:00:00:{:02x}:{:02x}\"}}\n",
                i >> 8,
                i & 255
            ));
        }
        let docs = parse_located(&text).unwrap();
        assert_eq!(docs.len(), 5000);
        assert_eq!(docs[4999].line, 4999 * 7 + 2);
        let list = format!(
            "kind: List\nitems:\n{}",
            "- {kind: Hardware}\n".repeat(3000)
        );
        assert_eq!(parse_documents(&list).unwrap().len(), 3000);
    }

    #[test]
    fn bombs_are_still_refused() {
        // A billion laughs: aliases multiply far past the input's size.
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for c in 'b'..='j' {
            text.push_str(&format!("{c}: &{c} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
            prev = c;
        }
        assert!(parse_documents(&text).is_err());
    }
}
