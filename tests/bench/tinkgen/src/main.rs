//! A tink-agent load generator for `tests/bench`: `--agents` agents, each on
//! its own HTTP/2 connection (one machine, one connection, as in a rack),
//! polling `GetAction` every `--interval-ms` (± `--jitter`, as tink-agent's
//! backoff randomizes its waits). An agent
//! that is served an action runs it at once: `ReportActionStatus` RUNNING,
//! then SUCCESS, then asks for the next without waiting.
//!
//!     tinkgen --addr http://10.64.0.1:42113 --agents 1000 --expect 5000 --steady 12
//!
//! Agent i is `02:00:xx:xx:xx:xx` (i big-endian), the MAC that
//! tests/bench/gen.py gives machine i, so its worker id is what a Template's
//! `worker: '{{.device_1}}'` renders to. It prints one JSON object:
//! actions/s over the burst (the first action served to the `--expect`th
//! success), and the latency of `GetAction` and of the reports, split into
//! the burst and the steady polling after it (after `--settle` seconds in
//! which the server finishes the Workflows). When the burst is done it
//! writes `burst done` to stderr, and `steady done` when the measured
//! polling is over and the `--tail` (polling, unmeasured) begins, so that a
//! script can measure something else under that load. Every call has a 5 s deadline; the run ends
//! `--steady` seconds after the burst or at `--max-secs`, whichever is first.
//!
//! The messages are written out by hand with prost's derive (wire-identical
//! to the upstream tink-agent .proto, field numbers and types): the four
//! messages do not justify a build script.
#![deny(unsafe_code)]

use clap::Parser;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
struct Args {
    /// tinkerbox's Tink gRPC address, http://IP:PORT
    #[arg(long)]
    addr: String,
    #[arg(long, default_value_t = 1000)]
    agents: u32,
    /// Machine number of the first agent (its MAC)
    #[arg(long, default_value_t = 0)]
    first: u32,
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Each wait is the interval times 1 ± this, at random: tink-agent's
    /// backoff (cenkalti/backoff, RandomizationFactor 0.5) jitters its
    /// polls so, and without it agents that finished their Workflows
    /// together poll together for ever. 0 polls in lockstep.
    #[arg(long, default_value_t = 0.5)]
    jitter: f64,
    /// Actions to run before the burst is over
    #[arg(long)]
    expect: u64,
    /// Seconds after the burst left out of the steady figures (the server
    /// finishing the Workflows: POST, events)
    #[arg(long, default_value_t = 2)]
    settle: u64,
    /// Seconds of polling measured after that
    #[arg(long, default_value_t = 10)]
    steady: u64,
    /// Seconds of polling after the measured window, unmeasured (the load
    /// under which a script measures something else; `steady done` on
    /// stderr marks its start)
    #[arg(long, default_value_t = 0)]
    tail: u64,
    #[arg(long, default_value_t = 300)]
    max_secs: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ActionRequest {
    #[prost(string, optional, tag = "1")]
    agent_id: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ActionResponse {
    #[prost(string, optional, tag = "1")]
    workflow_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    task_id: Option<String>,
    #[prost(string, optional, tag = "3")]
    agent_id: Option<String>,
    #[prost(string, optional, tag = "4")]
    action_id: Option<String>,
    #[prost(string, optional, tag = "5")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Timestamp {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ActionMessage {
    #[prost(string, optional, tag = "1")]
    message: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ActionStatusRequest {
    #[prost(string, optional, tag = "1")]
    workflow_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    agent_id: Option<String>,
    #[prost(string, optional, tag = "3")]
    task_id: Option<String>,
    #[prost(string, optional, tag = "4")]
    action_id: Option<String>,
    #[prost(string, optional, tag = "5")]
    action_name: Option<String>,
    /// RUNNING = 2, SUCCESS = 5
    #[prost(int32, optional, tag = "6")]
    action_state: Option<i32>,
    #[prost(message, optional, tag = "7")]
    execution_start: Option<Timestamp>,
    #[prost(message, optional, tag = "8")]
    execution_stop: Option<Timestamp>,
    #[prost(string, optional, tag = "9")]
    execution_duration: Option<String>,
    #[prost(message, optional, tag = "10")]
    message: Option<ActionMessage>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Empty {}

const GET: &str = "/proto.WorkflowService/GetAction";
const REPORT: &str = "/proto.WorkflowService/ReportActionStatus";
const DEADLINE: Duration = Duration::from_secs(5);

fn mac(i: u32) -> String {
    let b = i.to_be_bytes();
    format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

fn now_ts() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// One call's latency, and when it started (µs since the run began).
#[derive(Clone, Copy)]
struct Sample {
    at_us: u64,
    lat_us: u32,
}

#[derive(Default)]
struct AgentLog {
    get: Vec<Sample>,
    report: Vec<Sample>,
    codes: std::collections::BTreeMap<String, u64>,
    errors: Vec<String>,
}

struct Shared {
    start: Instant,
    expect: u64,
    done: AtomicU64,
    /// µs since start of the first served action, and of the burst's end
    /// (u64::MAX while not yet).
    first_us: AtomicU64,
    burst_us: AtomicU64,
    stop_at: AtomicU64,
    settle_us: u64,
    steady_us: u64,
    tail_us: u64,
}

impl Shared {
    fn us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
}

async fn unary<Req, Resp>(ch: &Channel, path: &'static str, req: Req) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut g = tonic::client::Grpc::new(ch.clone());
    g.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let mut r = tonic::Request::new(req);
    r.set_timeout(DEADLINE);
    g.unary(r, PathAndQuery::from_static(path), codec)
        .await
        .map(tonic::Response::into_inner)
}

async fn agent(
    i: u32,
    ch: Channel,
    sh: Arc<Shared>,
    interval: Duration,
    jitter: f64,
    offset: Duration,
) -> AgentLog {
    let mut rng = fastrand::Rng::with_seed(u64::from(i));
    let id = mac(i);
    let mut log = AgentLog::default();
    tokio::time::sleep(offset).await;
    loop {
        let stop = sh.stop_at.load(Ordering::Relaxed);
        if sh.us() >= stop {
            return log;
        }
        let t0 = Instant::now();
        let at_us = sh.us();
        let got = unary::<_, ActionResponse>(
            &ch,
            GET,
            ActionRequest {
                agent_id: Some(id.clone()),
            },
        )
        .await;
        let lat_us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
        log.get.push(Sample { at_us, lat_us });
        match got {
            Ok(a) => {
                *log.codes.entry("Ok".into()).or_default() += 1;
                sh.first_us.fetch_min(at_us, Ordering::Relaxed);
                let start = now_ts();
                let report = |state: i32, stop: Option<Timestamp>| ActionStatusRequest {
                    workflow_id: a.workflow_id.clone(),
                    agent_id: Some(id.clone()),
                    task_id: a.task_id.clone(),
                    action_id: a.action_id.clone(),
                    action_name: a.name.clone(),
                    action_state: Some(state),
                    execution_start: Some(start.clone()),
                    execution_duration: stop.as_ref().map(|_| "0s".to_string()),
                    execution_stop: stop,
                    message: Some(ActionMessage {
                        message: Some(
                            if state == 5 {
                                "action completed"
                            } else {
                                "running"
                            }
                            .into(),
                        ),
                    }),
                };
                let mut ok = true;
                for (state, stop) in [(2, None), (5, Some(now_ts()))] {
                    let t = Instant::now();
                    let at_us = sh.us();
                    let r = unary::<_, Empty>(&ch, REPORT, report(state, stop)).await;
                    log.report.push(Sample {
                        at_us,
                        lat_us: t.elapsed().as_micros().min(u32::MAX as u128) as u32,
                    });
                    if let Err(e) = r {
                        ok = false;
                        log.errors
                            .push(format!("report {}: {:?} {}", id, e.code(), e.message()));
                        break;
                    }
                }
                if ok {
                    let n = sh.done.fetch_add(1, Ordering::Relaxed) + 1;
                    if n == sh.expect {
                        let now = sh.us();
                        sh.burst_us.store(now, Ordering::Relaxed);
                        eprintln!("burst done");
                        sh.stop_at.fetch_min(
                            now + sh.settle_us + sh.steady_us + sh.tail_us,
                            Ordering::Relaxed,
                        );
                    }
                    // tink-agent asks for the next action at once.
                    continue;
                }
            }
            Err(e) => {
                let c = e.code();
                *log.codes.entry(format!("{c:?}")).or_default() += 1;
                if !matches!(c, Code::NotFound | Code::FailedPrecondition) && log.errors.len() < 10
                {
                    log.errors.push(format!("get {id}: {c:?} {}", e.message()));
                }
            }
        }
        let next = t0 + interval.mul_f64(1.0 + jitter * (2.0 * rng.f64() - 1.0));
        tokio::time::sleep_until(next.into()).await;
    }
}

fn pct(mut v: Vec<u32>) -> serde_json::Value {
    if v.is_empty() {
        return serde_json::json!({"n": 0});
    }
    v.sort_unstable();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        (v[i] as f64 / 1000.0 * 1000.0).round() / 1000.0
    };
    serde_json::json!({
        "n": v.len(),
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": at(1.0),
    })
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let interval = Duration::from_millis(a.interval_ms.max(1));
    let jitter = a.jitter.clamp(0.0, 0.99);
    let sh = Arc::new(Shared {
        start: Instant::now(),
        expect: a.expect,
        done: AtomicU64::new(0),
        first_us: AtomicU64::new(u64::MAX),
        burst_us: AtomicU64::new(u64::MAX),
        stop_at: AtomicU64::new(a.max_secs * 1_000_000),
        settle_us: a.settle * 1_000_000,
        steady_us: a.steady * 1_000_000,
        tail_us: a.tail * 1_000_000,
    });
    // Says when the measured window is over (the tail begins).
    let watch = {
        let sh = sh.clone();
        let window = (a.settle + a.steady) * 1_000_000;
        tokio::spawn(async move {
            loop {
                let burst = sh.burst_us.load(Ordering::Relaxed);
                if burst != u64::MAX && sh.us() >= burst + window {
                    eprintln!("steady done");
                    return;
                }
                if sh.us() >= sh.stop_at.load(Ordering::Relaxed) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let endpoint = match Endpoint::from_shared(a.addr.clone()) {
        Ok(e) => e.connect_timeout(DEADLINE).timeout(DEADLINE),
        Err(e) => {
            eprintln!("tinkgen: --addr {}: {e}", a.addr);
            std::process::exit(2);
        }
    };
    let mut tasks = Vec::with_capacity(a.agents as usize);
    for k in 0..a.agents {
        let ch = endpoint.connect_lazy();
        let sh = sh.clone();
        // Spread over one interval, as machines booted at different times.
        let offset = interval * k / a.agents.max(1);
        tasks.push(tokio::spawn(agent(
            a.first + k,
            ch,
            sh,
            interval,
            jitter,
            offset,
        )));
    }
    let mut all = AgentLog::default();
    for t in tasks {
        if let Ok(l) = t.await {
            all.get.extend(l.get);
            all.report.extend(l.report);
            for (k, v) in l.codes {
                *all.codes.entry(k).or_default() += v;
            }
            all.errors.extend(l.errors.into_iter().take(3));
        }
    }
    let end_us = sh.us();
    let burst = sh.burst_us.load(Ordering::Relaxed);
    let first = sh.first_us.load(Ordering::Relaxed);
    watch.abort();
    let steady_from = burst.saturating_add(a.settle * 1_000_000);
    let steady_end = steady_from.saturating_add(a.steady * 1_000_000);
    let split = |v: &[Sample], in_burst: bool| -> Vec<u32> {
        v.iter()
            .filter(|s| {
                if in_burst {
                    s.at_us < burst
                } else {
                    s.at_us >= steady_from && s.at_us < steady_end
                }
            })
            .map(|s| s.lat_us)
            .collect()
    };
    let done = sh.done.load(Ordering::Relaxed);
    let burst_s = if burst != u64::MAX && first != u64::MAX {
        (burst - first) as f64 / 1e6
    } else {
        f64::NAN
    };
    // The measured window: steady_from to steady_end, or the run's end.
    let steady_end = steady_end
        .min(sh.stop_at.load(Ordering::Relaxed))
        .min(end_us);
    let steady_s = if burst != u64::MAX {
        steady_end.saturating_sub(steady_from) as f64 / 1e6
    } else {
        0.0
    };
    let steady_get = split(&all.get, false);
    // How evenly the polls arrive: the most GetActions begun in one 10 ms
    // slot of the measured window (1,000 agents a second spread evenly
    // start about 10 in each).
    let peak_10ms = {
        let mut slots = std::collections::HashMap::<u64, u32>::new();
        for s in all
            .get
            .iter()
            .filter(|s| s.at_us >= steady_from && s.at_us < steady_end)
        {
            *slots.entry(s.at_us / 10_000).or_default() += 1;
        }
        slots.into_values().max().unwrap_or(0)
    };
    let out = serde_json::json!({
        "agents": a.agents,
        "interval_ms": a.interval_ms,
        "jitter": jitter,
        "expect": a.expect,
        "actions": done,
        "complete": done >= a.expect,
        "burst_s": (burst_s * 1000.0).round() / 1000.0,
        "actions_per_s": if burst_s > 0.0 { (done as f64 / burst_s).round() } else { 0.0 },
        "steady_s": (steady_s * 10.0).round() / 10.0,
        "steady_get_per_s": if steady_s > 0.0 { (steady_get.len() as f64 / steady_s).round() } else { 0.0 },
        "get_burst": pct(split(&all.get, true)),
        "get_steady": pct(steady_get),
        "steady_peak_10ms": peak_10ms,
        "report": pct(all.report.iter().map(|s| s.lat_us).collect()),
        "codes": all.codes,
        "errors": all.errors.into_iter().take(10).collect::<Vec<_>>(),
    });
    println!("{out}");
}
