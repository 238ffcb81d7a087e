//! `tinkerbox claim` and `tinkerbox release`: CAPM3's claim and release of
//! a BareMetalHost, for users without a cluster. The daemon picks the
//! host (at random among the available ones that match, as CAPM3 does);
//! these commands follow it through its states, bounded by `--timeout`.

use super::{Client, Target, encode};
use crate::hardware;
use anyhow::bail;
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

pub struct ClaimArgs<'a> {
    pub namespace: Option<&'a str>,
    pub selector: &'a str,
    pub host: Option<&'a str>,
    pub image: &'a str,
    pub checksum: Option<&'a str>,
    pub checksum_type: Option<&'a str>,
    pub format: Option<&'a str>,
    pub user_data: Option<String>,
    pub consumer: Option<&'a str>,
    pub wait: bool,
    pub timeout: Duration,
}

/// How often a waiting command reads the host.
const POLL: Duration = Duration::from_secs(2);

pub async fn claim(t: &Target, a: ClaimArgs<'_>) -> anyhow::Result<()> {
    let c = Client::new(t)?;
    let ns = a.namespace.unwrap_or(hardware::DEFAULT_NAMESPACE);
    let consumer = a
        .consumer
        .map(String::from)
        .unwrap_or_else(|| format!("claim-{}", crate::clock::now_ms()));
    let mut image = json!({"url": a.image});
    if let Some(s) = a.checksum {
        image["checksum"] = json!(s);
    }
    if let Some(s) = a.checksum_type {
        image["checksumType"] = json!(s);
    }
    if let Some(s) = a.format {
        image["format"] = json!(s);
    }
    let mut body =
        json!({"namespace": ns, "selector": a.selector, "image": image, "consumer": consumer});
    if let Some(h) = a.host {
        body["host"] = json!(h);
    }
    if let Some(u) = a.user_data {
        body["userData"] = json!(u);
    }
    let got = c
        .call_ok(
            Method::POST,
            "/api/v1/baremetalhosts/claim",
            &[],
            Some(body),
        )
        .await?;
    let name = got["name"].as_str().unwrap_or_default().to_string();
    println!("baremetalhost.metal3.io/{name} claimed by {consumer}");
    if a.wait {
        follow(&c, ns, &name, &["provisioned"], a.timeout).await?;
    }
    Ok(())
}

pub async fn release(
    t: &Target,
    name: &str,
    namespace: Option<&str>,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let c = Client::new(t)?;
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE);
    let path = format!("/api/v1/baremetalhosts/{}/release", encode(name));
    let q = [("namespace", ns.to_string())];
    let r = c.call_ok(Method::POST, &path, &q, None).await?;
    if r["state"] == "released" {
        println!("baremetalhost.metal3.io/{name} released");
        return Ok(());
    }
    println!(
        "baremetalhost.metal3.io/{name} releasing (its image cleared: it is cleaned, then available)"
    );
    if !wait {
        println!("run `tinkerbox release {name}` again once it is available to clear its consumer");
        return Ok(());
    }
    follow(&c, ns, name, &["available", "ready"], timeout).await?;
    let r = c.call_ok(Method::POST, &path, &q, None).await?;
    if r["state"] != "released" {
        bail!("{name} is {} after its cleaning, not available", r["state"]);
    }
    println!("baremetalhost.metal3.io/{name} released");
    Ok(())
}

/// Print the host's state as it changes until it is one of `want`;
/// an error (BMO's errorType) is printed as it appears.
async fn follow(
    c: &Client,
    ns: &str,
    name: &str,
    want: &[&str],
    timeout: Duration,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let mut last = (String::new(), String::new());
    loop {
        let h = c
            .get_one_or_list("/api/v1/baremetalhosts", Some(name), Some(ns.to_string()))
            .await?;
        let s = |p: &str| {
            h.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let now = (s("/status/provisioning/state"), s("/status/errorMessage"));
        if now != last {
            let secs = t0.elapsed().as_secs();
            match now.1.as_str() {
                "" => println!("{secs:>5}s  {}", now.0),
                e => println!("{secs:>5}s  {}  ({}: {e})", now.0, s("/status/errorType")),
            }
            last = now.clone();
        }
        if want.contains(&now.0.as_str()) {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!(
                "{name} is still {:?} after {}s (--timeout); it goes on: `tinkerbox get bmh {name}` follows it",
                now.0,
                timeout.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
