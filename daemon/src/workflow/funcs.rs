//! The functions a Template may call: Tinkerbell's own (`formatPartition`,
//! `netmaskToPrefixLength`, `toYaml`, `fromYaml`) and the part of Sprig's
//! hermetic set that templates use (strings, lists, dicts, defaults,
//! encodings, integer arithmetic). gotmpl brings Go's builtins (`index`,
//! `printf`, `eq`, `len`, ...). A function Sprig has and this list lacks is
//! an "undefined function" error at parse time, with its name, so a
//! template never renders half-understood.

use base64::Engine;
use gotmpl::{FuncMap, TemplateError, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

type Result<T> = std::result::Result<T, TemplateError>;

fn err(name: &str, msg: impl std::fmt::Display) -> TemplateError {
    TemplateError::Exec(format!("{name}: {msg}"))
}

fn args_n<'a>(name: &str, a: &'a [Value], n: usize) -> Result<&'a [Value]> {
    if a.len() == n {
        Ok(a)
    } else {
        Err(TemplateError::ArgCount {
            name: name.into(),
            expected: n,
            got: a.len(),
        })
    }
}

/// Go's `fmt.Sprint` of one value, which is what Sprig's string functions
/// apply to their arguments (`toString`).
fn text(v: &Value) -> String {
    match v {
        Value::Nil => String::new(),
        other => other.to_string(),
    }
}

fn int(name: &str, v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::Uint(u) => i64::try_from(*u).map_err(|_| err(name, "integer out of range")),
        Value::Float(f) => Ok(*f as i64),
        Value::String(s) => Ok(s.trim().parse().unwrap_or(0)),
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Nil => Ok(0),
        other => Err(err(
            name,
            format!("cannot use {} as a number", other.type_name()),
        )),
    }
}

fn s(v: impl Into<String>) -> Value {
    Value::String(Arc::from(v.into()))
}

fn list(v: &Value) -> Vec<Value> {
    match v {
        Value::List(l) => l.to_vec(),
        Value::Nil => vec![],
        other => vec![other.clone()],
    }
}

/// Sprig's `empty`: the zero value of its type.
fn empty(v: &Value) -> bool {
    match v {
        Value::Nil => true,
        Value::Bool(b) => !b,
        Value::Int(i) => *i == 0,
        Value::Uint(u) => *u == 0,
        Value::Float(f) => *f == 0.0,
        Value::String(s) => s.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        _ => false,
    }
}

/// Value -> JSON, for toJson / toYaml.
fn json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Nil => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::Uint(u) => J::from(*u),
        // Go's encoding/json writes an integral float64 as an integer.
        Value::Float(f) if f.fract() == 0.0 && f.abs() < 9e15 => J::from(*f as i64),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::String(s) => J::String(s.to_string()),
        Value::List(l) => J::Array(l.iter().map(json).collect()),
        Value::Map(m) => J::Object(m.iter().map(|(k, v)| (k.to_string(), json(v))).collect()),
        _ => J::Null,
    }
}

/// JSON -> Value as Go's `json.Unmarshal` into `interface{}` makes it:
/// every number a float64 (so 1000000 prints `1e+06`, as in Go).
pub fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Nil,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => n.as_f64().map_or(Value::Nil, Value::Float),
        J::String(s) => Value::String(Arc::from(s.as_str())),
        J::Array(a) => Value::List(a.iter().map(from_json).collect::<Vec<_>>().into()),
        J::Object(o) => Value::from(
            o.iter()
                .map(|(k, v)| (k.clone(), from_json(v)))
                .collect::<std::collections::BTreeMap<String, Value>>(),
        ),
    }
}

/// The function map for a Template.
pub fn map() -> FuncMap {
    let mut m = FuncMap::new();
    let mut f = |name: &'static str, g: fn(&'static str, &[Value]) -> Result<Value>| {
        m.insert(name.into(), Arc::new(move |a: &[Value]| g(name, a)));
    };

    // Tinkerbell's own (tink/controller/internal/workflow/template_funcs.go).
    f("formatPartition", |n, a| {
        let a = args_n(n, a, 2)?;
        let dev = text(&a[0]);
        let p = int(n, &a[1])?;
        Ok(s(format_partition(&dev, p)))
    });
    f("netmaskToPrefixLength", |n, a| {
        let a = args_n(n, a, 1)?;
        netmask_to_prefix_length(&text(&a[0]))
            .map(s)
            .map_err(|e| err(n, e))
    });
    f("toYaml", |n, a| {
        let a = args_n(n, a, 1)?;
        let y = serde_saphyr::to_string(&json(&a[0])).map_err(|e| err(n, e))?;
        Ok(s(y.strip_suffix('\n').unwrap_or(&y)))
    });
    f("fromYaml", |n, a| {
        let a = args_n(n, a, 1)?;
        let t = text(&a[0]);
        if t.is_empty() {
            return Err(err(n, "empty YAML input"));
        }
        let v: serde_json::Value = serde_saphyr::from_str(&t).map_err(|e| err(n, e))?;
        Ok(from_json(&v))
    });

    // Sprig: strings.
    f("toString", |n, a| Ok(s(text(&args_n(n, a, 1)?[0]))));
    f("trim", |n, a| Ok(s(text(&args_n(n, a, 1)?[0]).trim())));
    f("trimAll", |n, a| {
        let a = args_n(n, a, 2)?;
        let cut: Vec<char> = text(&a[0]).chars().collect();
        Ok(s(text(&a[1]).trim_matches(cut.as_slice())))
    });
    f("trimPrefix", |n, a| {
        let a = args_n(n, a, 2)?;
        let (p, t) = (text(&a[0]), text(&a[1]));
        Ok(s(t.strip_prefix(p.as_str()).unwrap_or(&t)))
    });
    f("trimSuffix", |n, a| {
        let a = args_n(n, a, 2)?;
        let (p, t) = (text(&a[0]), text(&a[1]));
        Ok(s(t.strip_suffix(p.as_str()).unwrap_or(&t)))
    });
    f("upper", |n, a| {
        Ok(s(text(&args_n(n, a, 1)?[0]).to_uppercase()))
    });
    f("lower", |n, a| {
        Ok(s(text(&args_n(n, a, 1)?[0]).to_lowercase()))
    });
    f("title", |n, a| {
        let t = text(&args_n(n, a, 1)?[0]);
        let mut out = String::with_capacity(t.len());
        let mut start = true;
        for c in t.chars() {
            out.extend(if start {
                c.to_uppercase().collect::<Vec<_>>()
            } else {
                vec![c]
            });
            start = c.is_whitespace();
        }
        Ok(s(out))
    });
    f("replace", |n, a| {
        let a = args_n(n, a, 3)?;
        Ok(s(text(&a[2]).replace(&text(&a[0]), &text(&a[1]))))
    });
    f("contains", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(Value::Bool(text(&a[1]).contains(&text(&a[0]))))
    });
    f("hasPrefix", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(Value::Bool(text(&a[1]).starts_with(&text(&a[0]))))
    });
    f("hasSuffix", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(Value::Bool(text(&a[1]).ends_with(&text(&a[0]))))
    });
    f("quote", |_, a| {
        let q: Vec<String> = a
            .iter()
            .filter(|v| !matches!(v, Value::Nil))
            .map(|v| go_quote(&text(v)))
            .collect();
        Ok(s(q.join(" ")))
    });
    f("squote", |_, a| {
        let q: Vec<String> = a
            .iter()
            .filter(|v| !matches!(v, Value::Nil))
            .map(|v| format!("'{}'", text(v)))
            .collect();
        Ok(s(q.join(" ")))
    });
    f("cat", |_, a| {
        let q: Vec<String> = a
            .iter()
            .filter(|v| !matches!(v, Value::Nil))
            .map(text)
            .collect();
        Ok(s(q.join(" ")))
    });
    f("indent", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(s(indent(int(n, &a[0])?, &text(&a[1]))))
    });
    f("nindent", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(s(format!("\n{}", indent(int(n, &a[0])?, &text(&a[1])))))
    });
    f("repeat", |n, a| {
        let a = args_n(n, a, 2)?;
        let times = usize::try_from(int(n, &a[0])?).unwrap_or(0);
        let t = text(&a[1]);
        if t.len().saturating_mul(times) > super::template::MAX_RENDERED {
            return Err(err(n, "result larger than a rendered template may be"));
        }
        Ok(s(t.repeat(times)))
    });
    f("substr", |n, a| {
        let a = args_n(n, a, 3)?;
        let t: Vec<char> = text(&a[2]).chars().collect();
        let (start, end) = (int(n, &a[0])?, int(n, &a[1])?);
        let len = t.len() as i64;
        let start = if start < 0 { 0 } else { start.min(len) };
        let end = if end < 0 || end > len {
            len
        } else {
            end.max(start)
        };
        Ok(s(t[start as usize..end as usize]
            .iter()
            .collect::<String>()))
    });
    f("trunc", |n, a| {
        let a = args_n(n, a, 2)?;
        let (c, t) = (int(n, &a[0])?, text(&a[1]));
        let chars: Vec<char> = t.chars().collect();
        let len = chars.len() as i64;
        Ok(s(if c >= 0 {
            chars[..c.min(len) as usize].iter().collect::<String>()
        } else {
            chars[(len + c).max(0) as usize..]
                .iter()
                .collect::<String>()
        }))
    });
    f("splitList", |n, a| {
        let a = args_n(n, a, 2)?;
        let (sep, t) = (text(&a[0]), text(&a[1]));
        Ok(Value::List(
            t.split(sep.as_str()).map(s).collect::<Vec<_>>().into(),
        ))
    });
    f("split", |n, a| {
        let a = args_n(n, a, 2)?;
        let (sep, t) = (text(&a[0]), text(&a[1]));
        let m: BTreeMap<String, Value> = t
            .split(sep.as_str())
            .enumerate()
            .map(|(i, p)| (format!("_{i}"), s(p)))
            .collect();
        Ok(Value::from(m))
    });
    f("join", |n, a| {
        let a = args_n(n, a, 2)?;
        let sep = text(&a[0]);
        Ok(s(list(&a[1])
            .iter()
            .map(text)
            .collect::<Vec<_>>()
            .join(&sep)))
    });
    f("b64enc", |n, a| {
        Ok(s(
            base64::engine::general_purpose::STANDARD.encode(text(&args_n(n, a, 1)?[0]))
        ))
    });
    f("b64dec", |n, a| {
        let t = text(&args_n(n, a, 1)?[0]);
        // Sprig returns the error text as the value; an error is clearer.
        let b = base64::engine::general_purpose::STANDARD
            .decode(t.trim())
            .map_err(|e| err(n, e))?;
        Ok(s(String::from_utf8_lossy(&b)))
    });
    f("sha256sum", |n, a| {
        let t = text(&args_n(n, a, 1)?[0]);
        Ok(s(hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            t.as_bytes(),
        ))))
    });

    // Sprig: defaults and flow.
    f("default", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(if empty(&a[1]) {
            a[0].clone()
        } else {
            a[1].clone()
        })
    });
    f("empty", |n, a| Ok(Value::Bool(empty(&args_n(n, a, 1)?[0]))));
    f("coalesce", |_, a| {
        Ok(a.iter().find(|v| !empty(v)).cloned().unwrap_or(Value::Nil))
    });
    f("ternary", |n, a| {
        let a = args_n(n, a, 3)?;
        Ok(if a[2].is_truthy() {
            a[0].clone()
        } else {
            a[1].clone()
        })
    });
    f("required", |n, a| {
        let a = args_n(n, a, 2)?;
        if matches!(&a[1], Value::Nil) || matches!(&a[1], Value::String(s) if s.is_empty()) {
            return Err(err(n, text(&a[0])));
        }
        Ok(a[1].clone())
    });
    f("fail", |n, a| Err(err(n, text(&args_n(n, a, 1)?[0]))));
    f("toJson", |n, a| {
        Ok(s(json(&args_n(n, a, 1)?[0]).to_string()))
    });
    f("toPrettyJson", |n, a| {
        serde_json::to_string_pretty(&json(&args_n(n, a, 1)?[0]))
            .map(s)
            .map_err(|e| err(n, e))
    });
    f("fromJson", |n, a| {
        let v: serde_json::Value =
            serde_json::from_str(&text(&args_n(n, a, 1)?[0])).unwrap_or_default();
        Ok(from_json(&v))
    });

    // Sprig: lists and dicts.
    f("list", |_, a| Ok(Value::List(a.to_vec().into())));
    f("first", |n, a| {
        Ok(list(&args_n(n, a, 1)?[0])
            .first()
            .cloned()
            .unwrap_or(Value::Nil))
    });
    f("last", |n, a| {
        Ok(list(&args_n(n, a, 1)?[0])
            .last()
            .cloned()
            .unwrap_or(Value::Nil))
    });
    f("has", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(Value::Bool(list(&a[1]).contains(&a[0])))
    });
    f("dict", |n, a| {
        if a.len() % 2 != 0 {
            return Err(err(n, "wants key value pairs"));
        }
        let m: BTreeMap<String, Value> = a.chunks(2).map(|p| (text(&p[0]), p[1].clone())).collect();
        Ok(Value::from(m))
    });
    f("get", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(match &a[0] {
            Value::Map(m) => m
                .get(text(&a[1]).as_str())
                .cloned()
                .unwrap_or_else(|| s("")),
            _ => s(""),
        })
    });
    f("hasKey", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(Value::Bool(
            matches!(&a[0], Value::Map(m) if m.contains_key(text(&a[1]).as_str())),
        ))
    });
    f("keys", |_, a| {
        let mut k: Vec<Value> = a
            .iter()
            .filter_map(|v| match v {
                Value::Map(m) => Some(
                    m.keys()
                        .map(|k| Value::String(k.clone()))
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        k.dedup();
        Ok(Value::List(k.into()))
    });

    // Sprig: integer arithmetic (Sprig converts to int64).
    f("add", |n, a| {
        a.iter()
            .try_fold(0i64, |acc, v| Ok(acc.wrapping_add(int(n, v)?)))
            .map(Value::Int)
    });
    f("add1", |n, a| {
        Ok(Value::Int(int(n, &args_n(n, a, 1)?[0])?.wrapping_add(1)))
    });
    f("sub", |n, a| {
        let a = args_n(n, a, 2)?;
        Ok(Value::Int(int(n, &a[0])?.wrapping_sub(int(n, &a[1])?)))
    });
    f("mul", |n, a| {
        a.iter()
            .try_fold(1i64, |acc, v| Ok(acc.wrapping_mul(int(n, v)?)))
            .map(Value::Int)
    });
    f("div", |n, a| {
        let a = args_n(n, a, 2)?;
        let d = int(n, &a[1])?;
        int(n, &a[0])?
            .checked_div(d)
            .map(Value::Int)
            .ok_or_else(|| err(n, "division by zero"))
    });
    f("mod", |n, a| {
        let a = args_n(n, a, 2)?;
        let d = int(n, &a[1])?;
        int(n, &a[0])?
            .checked_rem(d)
            .map(Value::Int)
            .ok_or_else(|| err(n, "division by zero"))
    });
    f("max", |n, a| {
        a.iter()
            .try_fold(i64::MIN, |acc, v| Ok(acc.max(int(n, v)?)))
            .map(Value::Int)
    });
    f("min", |n, a| {
        a.iter()
            .try_fold(i64::MAX, |acc, v| Ok(acc.min(int(n, v)?)))
            .map(Value::Int)
    });
    f("int", |n, a| Ok(Value::Int(int(n, &args_n(n, a, 1)?[0])?)));
    f("int64", |n, a| {
        Ok(Value::Int(int(n, &args_n(n, a, 1)?[0])?))
    });
    f("atoi", |n, a| {
        Ok(Value::Int(
            text(&args_n(n, a, 1)?[0]).trim().parse().unwrap_or(0),
        ))
    });
    m
}

/// `/dev/sda`,3 -> `/dev/sda3`; `/dev/nvme0n1`,3 -> `/dev/nvme0n1p3`;
/// `/dev/disk/by-id/x`,3 -> `/dev/disk/by-id/x-part3`.
pub fn format_partition(dev: &str, partition: i64) -> String {
    if dev.starts_with("/dev/disk/") {
        format!("{dev}-part{partition}")
    } else if dev.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{dev}p{partition}")
    } else {
        format!("{dev}{partition}")
    }
}

/// `255.255.255.0` -> `24`. A mask that is not contiguous is `0`, as Go's
/// `net.IPMask.Size` says.
pub fn netmask_to_prefix_length(mask: &str) -> std::result::Result<String, String> {
    let ip: std::net::IpAddr = mask
        .parse()
        .map_err(|_| format!("invalid netmask format: {mask}"))?;
    let v4 = match ip {
        std::net::IpAddr::V4(a) => a,
        std::net::IpAddr::V6(a) => a
            .to_ipv4_mapped()
            .ok_or_else(|| format!("netmask must be IPv4: {mask}"))?,
    };
    let bits = u32::from(v4);
    let ones = bits.leading_ones();
    Ok(if bits.checked_shl(ones).unwrap_or(0) == 0 {
        ones
    } else {
        0
    }
    .to_string())
}

fn indent(n: i64, t: &str) -> String {
    let pad = " ".repeat(usize::try_from(n).unwrap_or(0).min(1024));
    format!("{pad}{}", t.replace('\n', &format!("\n{pad}")))
}

/// Go's `strconv.Quote` for the common cases: `"`, `\`, and control
/// characters escaped.
fn go_quote(t: &str) -> String {
    let mut out = String::with_capacity(t.len() + 2);
    out.push('"');
    for c in t.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(src: &str, data: serde_json::Value) -> std::result::Result<String, String> {
        gotmpl::Template::new("t")
            .missing_key(gotmpl::MissingKey::Error)
            .funcs(map())
            .parse(src)
            .and_then(|t| t.execute_to_string(&gotmpl::to_value(&data).unwrap()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn tinkerbell_functions() {
        assert_eq!(format_partition("/dev/sda", 3), "/dev/sda3");
        assert_eq!(format_partition("/dev/nvme0n1", 3), "/dev/nvme0n1p3");
        assert_eq!(
            format_partition("/dev/disk/by-id/ata-X", 1),
            "/dev/disk/by-id/ata-X-part1"
        );
        assert_eq!(netmask_to_prefix_length("255.255.255.0").unwrap(), "24");
        assert_eq!(netmask_to_prefix_length("255.0.0.0").unwrap(), "8");
        assert_eq!(netmask_to_prefix_length("0.0.0.0").unwrap(), "0");
        assert_eq!(netmask_to_prefix_length("255.255.255.255").unwrap(), "32");
        assert_eq!(netmask_to_prefix_length("255.0.255.0").unwrap(), "0");
        assert!(
            netmask_to_prefix_length("fe80::1")
                .unwrap_err()
                .contains("must be IPv4")
        );
        assert!(
            netmask_to_prefix_length("x")
                .unwrap_err()
                .contains("invalid netmask format")
        );
        let j = serde_json::json!({"d": "/dev/vda", "m": "255.255.240.0", "o": {"a": [1, 2], "b": "x"}});
        assert_eq!(
            run(
                "{{ formatPartition .d 2 }} {{ netmaskToPrefixLength .m }}",
                j.clone()
            )
            .unwrap(),
            "/dev/vda2 20"
        );
        assert_eq!(
            run("{{ toYaml .o }}", j.clone()).unwrap(),
            "a:\n- 1\n- 2\nb: x"
        );
        assert_eq!(
            run("{{ (fromYaml \"k: [v]\").k }}", j.clone()).unwrap(),
            "[v]"
        );
        assert!(
            run("{{ fromYaml \"\" }}", j)
                .unwrap_err()
                .contains("empty YAML input")
        );
    }

    #[test]
    fn sprig_functions_as_sprig_does_them() {
        let j = serde_json::json!({"s": " Hi there ", "l": ["a", "b"], "e": "", "n": 7});
        let cases = [
            ("{{ trim .s | upper }}", "HI THERE"),
            ("{{ .s | trim | lower | title }}", "Hi There"),
            ("{{ .e | default \"d\" }}/{{ .n | default 3 }}", "d/7"),
            (
                "{{ join \",\" .l }} {{ first .l }} {{ last .l }} {{ has \"b\" .l }}",
                "a,b a b true",
            ),
            (
                "{{ quote \"a\\\"b\" }} {{ squote \"x\" }} {{ cat \"a\" 1 }}",
                "\"a\\\"b\" 'x' a 1",
            ),
            (
                "{{ replace \"-\" \"_\" \"a-b-c\" }} {{ trimPrefix \"/dev/\" \"/dev/sda\" }}",
                "a_b_c sda",
            ),
            (
                "{{ add 1 2 3 }} {{ sub 5 7 }} {{ mul 2 3 }} {{ div 7 2 }} {{ mod 7 2 }} {{ add1 .n }}",
                "6 -2 6 3 1 8",
            ),
            ("{{ \"abc\" | b64enc }} {{ \"YWJj\" | b64dec }}", "YWJj abc"),
            (
                "{{ toJson .l }} {{ (dict \"k\" 1).k }} {{ get (dict \"k\" 2) \"k\" }}",
                "[\"a\",\"b\"] 1 2",
            ),
            (
                "{{ indent 2 \"a\\nb\" }}|{{ nindent 1 \"c\" }}",
                "  a\n  b|\n c",
            ),
            (
                "{{ substr 1 3 \"hello\" }} {{ trunc 2 \"hello\" }} {{ trunc -2 \"hello\" }}",
                "el he lo",
            ),
            (
                "{{ ternary \"y\" \"n\" true }} {{ empty .e }} {{ coalesce .e \"c\" }}",
                "y true c",
            ),
            (
                "{{ splitList \":\" \"a:b\" | join \"+\" }} {{ (split \":\" \"a:b\")._1 }}",
                "a+b b",
            ),
            (
                "{{ atoi \"42\" | add 1 }} {{ sha256sum \"\" | trunc 8 }}",
                "43 e3b0c442",
            ),
        ];
        for (src, want) in cases {
            assert_eq!(run(src, j.clone()).as_deref(), Ok(want), "{src}");
        }
        assert!(
            run("{{ required \"need x\" .e }}", j.clone())
                .unwrap_err()
                .contains("need x")
        );
        assert!(
            run("{{ div 1 0 }}", j.clone())
                .unwrap_err()
                .contains("division by zero")
        );
        assert!(run("{{ env \"HOME\" }}", j).unwrap_err().contains("env"));
    }
}
