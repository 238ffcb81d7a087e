//! Where the agent learns its server and its name. Smee's iPXE script puts
//! them on the kernel command line (`grpc_authority=10.1.1.1:42113
//! worker_id=52:54:00:.. tinkerbell_tls=false tinkerbell_insecure_tls=false
//! syslog_host=10.1.1.1`); a flag or an environment variable (tink-agent's
//! names) overrides the command line, for running the agent by hand.

use std::collections::HashMap;

/// What the agent runs with, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `host:port` of Tink's gRPC API.
    pub authority: String,
    /// The name the Workflow's task was rendered for (`spec.agentID` or
    /// the MAC the machine booted from).
    pub worker_id: String,
    pub tls: bool,
    /// TLS without checking the server's certificate.
    pub insecure_tls: bool,
    /// Where the agent's log lines go too (UDP 514), when set.
    pub syslog_host: Option<String>,
    /// Registries oci2disk may pull from in plain HTTP (HookOS's
    /// `insecure_registries=`, comma separated).
    pub insecure_registries: String,
}

/// Values given by flag or environment, each overriding the command line.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub authority: Option<String>,
    pub worker_id: Option<String>,
    pub tls: Option<bool>,
    pub insecure_tls: Option<bool>,
    pub syslog_host: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "no Tink server: give grpc_authority=HOST:PORT on the kernel command line or --tink-server-addr"
    )]
    NoAuthority,
    #[error("grpc_authority {0:?} is not HOST:PORT")]
    BadAuthority(String),
    #[error("no worker id: give worker_id= (or hw_addr=) on the kernel command line or --agent-id")]
    NoWorkerId,
    #[error("{key}={value:?} is not a boolean (true/false, 1/0, yes/no)")]
    BadBool { key: &'static str, value: String },
}

/// The `key=value` words of a kernel command line; a value may be
/// double-quoted to hold spaces (`key="a b"`). Words without `=` are flags
/// (value ""). The last of a repeated key wins, as the kernel's own
/// parameters do.
pub fn parse_cmdline(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut flush = |w: &mut String| {
        if !w.is_empty() {
            match w.split_once('=') {
                Some((k, v)) => out.insert(k.to_string(), v.to_string()),
                None => out.insert(w.clone(), String::new()),
            };
            w.clear();
        }
    };
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => flush(&mut word),
            c => word.push(c),
        }
    }
    flush(&mut word);
    out
}

fn boolean(key: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "t" => Ok(true),
        "" | "0" | "false" | "no" | "off" | "f" => Ok(false),
        _ => Err(ConfigError::BadBool {
            key,
            value: v.to_string(),
        }),
    }
}

/// Options from the command line's words, overridden by `o`.
pub fn resolve(cmdline: &HashMap<String, String>, o: &Overrides) -> Result<Options, ConfigError> {
    let get = |k: &str| cmdline.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let authority = o
        .authority
        .clone()
        .or_else(|| get("grpc_authority").map(str::to_string))
        .ok_or(ConfigError::NoAuthority)?;
    let port_ok = authority
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(ConfigError::BadAuthority(authority));
    }
    let worker_id = o
        .worker_id
        .clone()
        .or_else(|| get("worker_id").map(str::to_string))
        .or_else(|| get("hw_addr").map(str::to_string))
        .ok_or(ConfigError::NoWorkerId)?;
    let tls = match o.tls {
        Some(b) => b,
        None => boolean("tinkerbell_tls", get("tinkerbell_tls").unwrap_or(""))?,
    };
    let insecure_tls = match o.insecure_tls {
        Some(b) => b,
        None => boolean(
            "tinkerbell_insecure_tls",
            get("tinkerbell_insecure_tls").unwrap_or(""),
        )?,
    };
    let syslog_host = o
        .syslog_host
        .clone()
        .or_else(|| get("syslog_host").map(str::to_string))
        .filter(|h| !h.is_empty());
    Ok(Options {
        authority,
        worker_id,
        tls,
        insecure_tls,
        syslog_host,
        insecure_registries: get("insecure_registries").unwrap_or("").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smee_cmdline() {
        let line = "BOOT_IMAGE=vmlinuz initrd=initramfs console=ttyS0,115200 quiet \
            grpc_authority=10.99.0.1:42113 tinkerbell_tls=false tinkerbell_insecure_tls=false \
            worker_id=52:54:00:00:00:01 hw_addr=52:54:00:00:00:01 syslog_host=10.99.0.1 \
            packet_action=workflow insecure_registries=10.99.0.1:5000,reg.lab\n";
        let o = resolve(&parse_cmdline(line), &Overrides::default()).unwrap();
        assert_eq!(
            o,
            Options {
                authority: "10.99.0.1:42113".into(),
                worker_id: "52:54:00:00:00:01".into(),
                tls: false,
                insecure_tls: false,
                syslog_host: Some("10.99.0.1".into()),
                insecure_registries: "10.99.0.1:5000,reg.lab".into(),
            }
        );
    }

    #[test]
    fn quotes_flags_and_repeats() {
        let m = parse_cmdline(r#"a="x y" quiet b=1 b=2 c="""#);
        assert_eq!(m["a"], "x y");
        assert_eq!(m["quiet"], "");
        assert_eq!(m["b"], "2");
        assert_eq!(m["c"], "");
    }

    #[test]
    fn overrides_win_and_hw_addr_is_the_fallback() {
        let m = parse_cmdline("grpc_authority=1.2.3.4:42113 hw_addr=aa tinkerbell_tls=true");
        let o = resolve(
            &m,
            &Overrides {
                authority: Some("5.6.7.8:1".into()),
                tls: Some(false),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(o.authority, "5.6.7.8:1");
        assert_eq!(o.worker_id, "aa");
        assert!(!o.tls);
        assert!(o.syslog_host.is_none());
    }

    #[test]
    fn clear_errors() {
        let none = Overrides::default();
        assert_eq!(
            resolve(&parse_cmdline("worker_id=x"), &none),
            Err(ConfigError::NoAuthority)
        );
        assert_eq!(
            resolve(&parse_cmdline("grpc_authority=10.0.0.1 worker_id=x"), &none),
            Err(ConfigError::BadAuthority("10.0.0.1".into()))
        );
        assert_eq!(
            resolve(&parse_cmdline("grpc_authority=h:1"), &none),
            Err(ConfigError::NoWorkerId)
        );
        assert!(matches!(
            resolve(
                &parse_cmdline("grpc_authority=h:1 worker_id=x tinkerbell_tls=maybe"),
                &none
            ),
            Err(ConfigError::BadBool { .. })
        ));
    }
}
