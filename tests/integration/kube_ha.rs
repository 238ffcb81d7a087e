//! Two tinkerbox instances on one cluster (a real kube-apiserver where
//! KUBEBUILDER_ASSETS has one, else kmock): one leader, followers that
//! forward the worker API to it, failover that loses no acknowledged
//! report and serves no finished action again.

use crate::common::{Daemon, hw_doc};
use crate::kube::{
    Cluster, M1, bmc_node_docs, cluster_get, healthz, kube_daemon, kube_daemon_at,
    kube_daemon_with, until, workflow_docs,
};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Hardware m1, a Template of three actions for it, and Workflow `name`.
fn docs(name: &str) -> String {
    format!(
        "{}---\n{}",
        hw_doc("m1", M1, "10.10.0.1"),
        workflow_docs("t3", &["x", "y", "z"], name, "m1", M1, "")
    )
}

fn served(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["event"] == "served")
        .map(|l| l["action"].as_str().unwrap_or("").to_string())
        .collect()
}

fn leads(d: &Daemon) -> bool {
    healthz(d).contains("kube: leader")
}

/// The actions' states in the cluster's copy of Workflow `name`.
fn cluster_actions(c: &Cluster, name: &str) -> Vec<String> {
    let w = cluster_get(c, "workflow", name);
    w["status"]["tasks"][0]["actions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["state"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn cluster_state(c: &Cluster, name: &str) -> String {
    cluster_get(c, "workflow", name)["status"]["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Instance `a` leads; `b` follows with a current mirror.
fn pair(cluster: &Cluster, a: Daemon) -> (Daemon, Daemon) {
    until(20, "a leads", &a, || leads(&a));
    let b = kube_daemon(cluster);
    until(15, "b's mirror", &b, || {
        healthz(&b).contains("kube: current")
    });
    assert!(healthz(&b).contains("kube: follower"), "{}", healthz(&b));
    (a, b)
}

/// A machine that booted from the follower talks to the follower: its
/// calls reach the leader, and every report is in the cluster before the
/// agent is answered (checked the moment the agent returns, with no wait).
/// A change to the Workflow afterwards loses nothing on either instance.
/// Then the leader is SIGKILLed while the agent runs y: the follower takes
/// over from the cluster's copy, and the agent (polling through the
/// failover, answered Unavailable meanwhile) gets y again and z, never x.
#[test]
fn an_agent_on_the_follower_loses_nothing_when_the_leader_is_killed() {
    let cluster = Cluster::start();
    let (mut a, b) = pair(&cluster, kube_daemon(&cluster));
    cluster.kubectl(&["create", "-f", "-"], Some(&docs("wf3")));
    until(20, "PENDING in the cluster", &a, || {
        cluster_state(&cluster, "wf3") == "PENDING"
    });

    let first = crate::tink::peer(&b, &["agent", M1, "--hang", "y"]);
    assert_eq!(served(&first), ["x", "y"], "{first:#?}");
    assert_eq!(
        cluster_actions(&cluster, "wf3"),
        ["SUCCESS", "RUNNING", "PENDING"],
        "every answered report is in the cluster at once"
    );
    // A change to the Workflow: the follower's copy is the cluster's, with
    // every report in it (it was once replaced by an older one).
    cluster.kubectl(&["label", "workflow", "wf3", "touched=1"], None);
    until(10, "the follower's copy after the change", &b, || {
        let (_, w) = b.api("GET", "/api/v1/workflows/wf3?namespace=default", None);
        w["metadata"]["labels"]["touched"] == "1"
            && w["status"]["tasks"][0]["actions"][0]["state"] == "SUCCESS"
            && w["status"]["tasks"][0]["actions"][1]["state"] == "RUNNING"
    });

    // The leader dies in the middle of y.
    let t0 = Instant::now();
    a.kill9();
    let second = crate::tink::peer(&b, &["agent", M1, "--polls", "1200"]);
    let waited = t0.elapsed();
    assert_eq!(served(&second), ["y", "z"], "{second:#?}");
    assert!(
        second
            .iter()
            .any(|l| l["event"] == "get_action" && l["code"] == "UNAVAILABLE"),
        "no leader for a while: the agent is told to retry, not served from a copy: {second:#?}"
    );
    assert!(leads(&b), "{}", healthz(&b));
    until(20, "SUCCESS in the cluster", &b, || {
        cluster_state(&cluster, "wf3") == "SUCCESS"
    });
    assert_eq!(
        cluster_actions(&cluster, "wf3"),
        ["SUCCESS", "SUCCESS", "SUCCESS"]
    );
    eprintln!(
        "kube_ha: the follower served the agent again {waited:?} after the leader was killed"
    );
}

/// Two instances start together onto a Lease that a dead instance held:
/// both see it, both wait out its duration, both try at once, and one
/// wins: never two leaders, at any moment.
#[test]
fn two_followers_released_at_once_onto_an_expired_lease_make_one_leader() {
    let cluster = Cluster::start();
    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: tinkerbox, namespace: default}\n\
             spec: {holderIdentity: gone-4242, leaseDurationSeconds: 15, leaseTransitions: 3, \
             acquireTime: \"2026-01-01T00:00:00.000000Z\", renewTime: \"2026-01-01T00:00:00.000000Z\"}\n",
        ),
    );
    let a = kube_daemon(&cluster);
    let b = kube_daemon(&cluster);
    until(40, "a leader", &a, || leads(&a) || leads(&b));
    // Watch both for a while: exactly one leads, every time.
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        let (la, lb) = (leads(&a), leads(&b));
        assert!(la != lb, "a leads: {la}, b leads: {lb}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let winner = if leads(&a) { &a } else { &b };
    let pid = winner.child.as_ref().expect("running").id();
    let lease = cluster_get(&cluster, "lease", "tinkerbox");
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or("");
    assert!(holder.ends_with(&format!("-{pid}")), "{lease:#}");
    assert_eq!(
        lease["spec"]["leaseTransitions"], 4,
        "one transition: {lease:#}"
    );
    assert!(
        lease["metadata"]["annotations"]["tinkerbox.io/grpc-address"]
            .as_str()
            .is_some_and(|a| a.ends_with(&format!(":{}", winner.tink.port()))),
        "the leader says where its worker API is: {lease:#}"
    );
}

/// A TCP relay to the API server that the test can cut: from then on it
/// accepts and reads but forwards nothing, both ways, so calls hang as
/// behind a dead link (not refused: that would be the easy case).
struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(upstream: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c2, s2, k2) = (cut.clone(), stop.clone(), conns.clone());
        let accept = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                let Ok((down, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = down.set_nonblocking(false);
                k2.lock().unwrap().push(down.try_clone().unwrap());
                if c2.load(Ordering::Relaxed) {
                    continue; // held open, never answered
                }
                let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
                    continue;
                };
                k2.lock().unwrap().push(up.try_clone().unwrap());
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    let cut = c2.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        // Ends when either side closes (the relay's drop
                        // shuts every socket down).
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if !cut.load(Ordering::Relaxed) && to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Relay {
            addr,
            cut,
            stop,
            conns,
            accept: Some(accept),
        }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// The kubeconfig of `c`, through `relay`.
fn kubeconfig_via(c: &Cluster, relay: &Relay, dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap();
    let at = text.find("://127.0.0.1:").expect("a loopback server") + "://127.0.0.1:".len();
    let end = at + text[at..].find(|ch: char| !ch.is_ascii_digit()).unwrap();
    let text = format!("{}{}{}", &text[..at], relay.addr.port(), &text[end..]);
    let p = dir.join("kubeconfig-relay");
    std::fs::write(&p, text).unwrap();
    p
}

fn upstream(c: &Cluster) -> SocketAddr {
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap();
    let at = text.find("://127.0.0.1:").expect("a loopback server") + "://".len();
    let end = at + text[at..].find(['"', ' ', '\n']).unwrap();
    text[at..end].parse().unwrap()
}

/// The leader loses the API server (the link hangs): it steps down within
/// the Lease's duration, before the other may take it; the other leads,
/// and the agent (on the other instance) goes on from the cluster's copy:
/// every action served once, except the one it was running.
#[test]
fn a_leader_cut_off_from_the_api_server_steps_down_and_nothing_runs_twice() {
    let cluster = Cluster::start();
    let relay = Relay::start(upstream(&cluster));
    let dir = tempfile::tempdir().unwrap();
    let via = kubeconfig_via(&cluster, &relay, dir.path());
    let a = kube_daemon_at(&via, "");
    let (a, b) = pair(&cluster, a);
    cluster.kubectl(&["create", "-f", "-"], Some(&docs("wf4")));
    until(20, "PENDING in the cluster", &a, || {
        cluster_state(&cluster, "wf4") == "PENDING"
    });
    let first = crate::tink::peer(&b, &["agent", M1, "--hang", "y"]);
    assert_eq!(served(&first), ["x", "y"], "{first:#?}");

    relay.cut();
    let t0 = Instant::now();
    until(15, "the cut-off leader steps down", &a, || !leads(&a));
    let stepped = t0.elapsed();
    until(30, "the other leads", &b, || leads(&b));
    let took = t0.elapsed();
    let second = crate::tink::peer(&b, &["agent", M1, "--polls", "600"]);
    assert_eq!(served(&second), ["y", "z"], "{second:#?}");
    until(20, "SUCCESS in the cluster", &b, || {
        cluster_state(&cluster, "wf4") == "SUCCESS"
    });
    assert!(
        !leads(&a),
        "the cut-off instance never leads again while cut off"
    );
    eprintln!("kube_ha: stepped down after {stepped:?}; the other led after {took:?}");
}

/// The leader dies while a Workflow's netboot Job runs (its BMC does not
/// answer yet, so the first command is being retried): the cluster had
/// the Job Running before any command was sent, so the new leader never
/// sends it again, though the BMC now answers. The Job fails, saying why,
/// and so does the Workflow: at most once, and never silently.
#[test]
fn a_bmc_job_interrupted_by_the_leaders_death_is_never_sent_again() {
    let cluster = Cluster::start();
    let port = crate::common::free_port();
    let bmc = "[bmc]\nattempts = 6\n";
    let (mut a, b) = pair(&cluster, kube_daemon_with(&cluster, bmc));
    let docs = format!(
        "{node}---\n{}",
        workflow_docs(
            "t5",
            &["x"],
            "wf5",
            "node-5",
            "52:54:00:6b:00:55",
            "  bootOptions: {bootMode: netboot}\n"
        ),
        node = bmc_node_docs(
            "bmc-5",
            "node-5",
            &format!("http://127.0.0.1:{port}"),
            "52:54:00:6b:00:55",
            "10.9.0.55"
        )
    );
    cluster.kubectl(&["create", "-f", "-"], Some(&docs));
    let job = || cluster_get(&cluster, "jobs.bmc.tinkerbell.org", "netboot-wf5");
    let conditions = |j: &Value| j["status"]["conditions"].to_string();
    until(30, "the Job Running in the cluster", &a, || {
        let j = cluster
            .kubectl_output(
                &[
                    "get",
                    "jobs.bmc.tinkerbell.org",
                    "netboot-wf5",
                    "-o",
                    "json",
                ],
                None,
            )
            .stdout;
        serde_json::from_slice::<Value>(&j).is_ok_and(|j| conditions(&j).contains("Running"))
    });
    a.kill9();
    // The BMC answers from now on: whoever sent the job again would reach it.
    let _bmc = crate::bmc_jobs::Sushy::start_on(port);
    until(60, "the Workflow FAILED", &b, || {
        cluster_state(&cluster, "wf5") == "FAILED"
    });
    let j = job();
    assert!(
        conditions(&j).contains("Failed") && conditions(&j).contains("not run again"),
        "{j:#}"
    );
    let (code, events) = b.api("GET", "/api/v1/events?limit=1000", None);
    assert_eq!(code, 200, "{events}");
    let sent: Vec<&Value> = events["items"]
        .as_array()
        .map(|v| v.iter().filter(|e| e["kind"] == "bmc.power").collect())
        .unwrap_or_default();
    assert!(
        sent.is_empty(),
        "the new leader sent BMC commands: {sent:#?}"
    );
}
