//! What the network-namespace tests share: bounded commands (every wait
//! has a limit, every process is killed by PID when it overruns), commands
//! inside a namespace, tests/lab/lib.sh, and prerequisite checks.

use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const LAB_LIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/lab/lib.sh");

/// A finished (or timed-out and killed) command.
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn describe(&self) -> String {
        let st = match self.status {
            Some(s) => s.to_string(),
            None => "killed after its time limit".into(),
        };
        format!(
            "{st} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.took,
            self.stdout,
            tail(&self.stderr, 60)
        )
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Run `cmd` for at most `limit`, then SIGKILL it by PID. Output goes to
/// unnamed files, not pipes, so nothing it leaves behind can block us.
pub fn run(mut cmd: Command, limit: Duration) -> Ran {
    let mut out = tempfile::tempfile().unwrap();
    let mut err = tempfile::tempfile().unwrap();
    let what = format!("{cmd:?}");
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let read = |f: &mut File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Ran {
        status,
        stdout: read(&mut out),
        stderr: read(&mut err),
        took,
    }
}

#[track_caller]
pub fn run_ok(cmd: Command, limit: Duration) -> Ran {
    let what = format!("{cmd:?}");
    let r = run(cmd, limit);
    assert!(r.ok(), "{what}: {}", r.describe());
    r
}

/// A command inside a namespace.
pub fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// Poll `f` until it gives a value, for at most `limit`.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// What the namespace lab tests need: root, and each program (with the
/// Debian package that has it); a clear failure naming it otherwise.
pub fn require(suite: &str, programs: &[(&str, &str)]) {
    assert!(
        is_root(),
        "the {suite} lab tests make network namespaces: run them as root"
    );
    for (program, package) in programs {
        assert!(
            have(program),
            "{program} not found: apt-get install {package} (tests/deps)"
        );
    }
}

pub fn have(program: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin"])
        .any(|dir| Path::new(dir).join(program).is_file())
}

/// A function of tests/lab/lib.sh with its arguments.
pub fn lab_sh(args: &[&str]) -> Ran {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", ". \"$0\" && \"$@\"", LAB_LIB]).args(args);
    run_ok(cmd, Duration::from_secs(60))
}

/// `struct $name(netns::Lab)` that derefs to the lab: a test file's own
/// lab type, for its own helpers beside [`Lab`]'s.
macro_rules! lab_newtype {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        struct $name($crate::netns::Lab);

        impl std::ops::Deref for $name {
            type Target = $crate::netns::Lab;
            fn deref(&self) -> &$crate::netns::Lab {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $crate::netns::Lab {
                &mut self.0
            }
        }
    };
}
pub(crate) use lab_newtype;

/// The lab bridge's address (as in tests/lab/boot).
pub const BRIDGE_CIDR: &str = "10.99.0.1/24";

/// Namespace `PREFIX-TAG-PID` with br0 = 10.99.0.1/24, plus client
/// namespaces on veths into br0, and a scratch directory. Drop runs
/// lab_down: every process left inside is killed and the namespaces are
/// deleted, also when the test failed.
pub struct Lab {
    pub ns: String,
    clients: Vec<String>,
    tag: String,
    dir: tempfile::TempDir,
}

impl Lab {
    pub fn new(prefix: &str, tag: &str) -> Lab {
        let lab = Lab {
            ns: format!("{prefix}-{tag}-{}", std::process::id()),
            clients: vec![],
            tag: tag.to_string(),
            dir: tempfile::tempdir().unwrap(),
        };
        // Built after the guard exists: a failing lab_up is cleaned up too.
        lab_sh(&["lab_up", &lab.ns, BRIDGE_CIDR]);
        lab
    }

    /// The name `ROLE-TAG-PID` for a namespace the caller makes, deleted
    /// with the lab.
    pub fn own(&mut self, role: &str) -> String {
        let ns = format!("{role}-{}-{}", self.tag, std::process::id());
        self.clients.push(ns.clone());
        ns
    }

    /// A namespace `ROLE-TAG-PID` whose eth0 (a veth into br0) has `mac`
    /// and, when given, the address `cidr`. Roles must differ in their
    /// first letters (lib.sh names the bridge end after 13 characters).
    pub fn client(&mut self, role: &str, mac: &str, cidr: Option<&str>) -> String {
        let ns = self.own(role);
        lab_sh(&["lab_veth", &self.ns, &ns]);
        let mut c = in_ns(&ns, "ip");
        c.args(["link", "set", "dev", "eth0", "address", mac]);
        run_ok(c, Duration::from_secs(10));
        if let Some(cidr) = cidr {
            let mut c = in_ns(&ns, "ip");
            c.args(["addr", "add", cidr, "dev", "eth0"]);
            run_ok(c, Duration::from_secs(10));
        }
        ns
    }

    /// The lab's scratch directory, and a file in it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let mut args = vec!["lab_down", self.ns.as_str()];
        args.extend(self.clients.iter().map(String::as_str));
        let mut cmd = Command::new("bash");
        cmd.args(["-c", ". \"$0\" && \"$@\"", LAB_LIB]).args(&args);
        let r = run(cmd, Duration::from_secs(60));
        if !r.ok() {
            eprintln!("lab_down {args:?}: {}", r.describe());
        }
    }
}
