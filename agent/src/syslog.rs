//! The agent's log lines, also sent to `syslog_host` (UDP 514), where
//! tinkerbox's syslog receiver files them under the machine, as HookOS's
//! docker sends its containers' logs there.

use std::io::Write;
use std::net::UdpSocket;
use std::sync::Arc;

/// One datagram per log line, RFC 3164 style (`<14>` = user.info).
#[derive(Clone)]
pub struct Syslog {
    sock: Arc<UdpSocket>,
}

impl Syslog {
    pub fn connect(host: &str) -> std::io::Result<Syslog> {
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        let target: String = if host.parse::<std::net::SocketAddr>().is_ok() {
            host.to_string()
        } else if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            std::net::SocketAddr::new(ip, 514).to_string()
        } else if host.contains(':') {
            host.to_string()
        } else {
            format!("{host}:514")
        };
        sock.connect(target)?;
        Ok(Syslog {
            sock: Arc::new(sock),
        })
    }
}

impl Write for Syslog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        let line = line.trim_end();
        if !line.is_empty() {
            let msg = format!("<14>tinkerbox-agent[{}]: {line}", std::process::id());
            // Logging must never stop the agent: a lost line is lost.
            let _ = self.sock.send(&msg.as_bytes()[..msg.len().min(2048)]);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Syslog {
    type Writer = Syslog;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
