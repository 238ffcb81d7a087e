//! IPMI 2.0 over LAN (RMCP+, cipher suite 3) through ipmi-rs: chassis power
//! and the boot device override, as Rufio's IPMI provider does.
//!
//! ipmi-rs 0.6 brings the RMCP+ session (RAKP-HMAC-SHA1, HMAC-SHA1-96,
//! AES-CBC-128) but no chassis commands; those are defined here on its
//! `IpmiCommand` trait. ipmi-rs is blocking, never retransmits and has a few
//! panicking paths, so each call runs on tokio's blocking pool under a hard
//! deadline, with short socket read timeouts and the retries done here.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use ipmi_rs::IpmiError;
use ipmi_rs::app::auth::PrivilegeLevel;
use ipmi_rs::app::auth::{ChannelAuthenticationCapabilities, GetChannelAuthenticationCapabilities};
use ipmi_rs::connection::{
    Channel, IpmiCommand, IpmiConnection, LogicalUnit, Message, NetFn, NotEnoughData, Request,
    RequestTargetAddress,
};
use ipmi_rs::rmcp::{
    ActivationError, ParseSessionResponseError, RakpMessage2ErrorStatusCode as Rakp2Status,
    RakpMessage2ParseError as Rakp2Error, RakpMessage4ErrorStatusCode as Rakp4Status,
    RakpMessage4ParseError as Rakp4Error, Rmcp, RmcpIpmiError, RmcpIpmiReceiveError,
    V2_0ActivationError as V2Error,
};

use super::{BmcError, BootDevice, PowerAction, PowerState, Target};

/// The RMCP port (ASF / IPMI over LAN).
pub const DEFAULT_PORT: u16 = 623;

/// The only cipher suite ipmi-rs implements: RAKP-HMAC-SHA1 authentication,
/// HMAC-SHA1-96 integrity, AES-CBC-128 confidentiality.
pub const CIPHER_SUITE: u8 = 3;

/// ADMINISTRATOR: chassis control needs it, and an RMCP+ session starts lower.
const ADMINISTRATOR: u8 = 4;

protocol!(Ipmi, "ipmi");

/// Chassis power after an action, or now (`PowerAction::Status`). For off,
/// soft and cycle the BMC may still report the old state for a while: this
/// returns what it reports. If the action went through but the read-back
/// fails, the state is `Unknown` rather than an error, so that a caller does
/// not repeat a cycle or reset that already happened.
pub async fn power(t: &Target, action: PowerAction) -> Result<PowerState, BmcError> {
    run(t, move |s| {
        if let Some(code) = control_code(action) {
            s.call(ChassisControl(code))?;
            return Ok(match s.call(GetChassisStatus) {
                Ok(status) => status.power_state(),
                Err(e) => {
                    tracing::warn!(bmc = %s.endpoint, ?action, error = %e,
                        "chassis control done; reading the power state back failed");
                    PowerState::Unknown
                }
            });
        }
        Ok(s.call(GetChassisStatus)?.power_state())
    })
    .await
}

/// Set the boot device override (Set System Boot Options, parameter 5), with
/// the same sequence as `ipmitool chassis bootdev`: set-in-progress, clear the
/// BIOS boot-info acknowledge, boot flags, commit, set-complete. Only the boot
/// flags must succeed; many BMCs (ipmi_sim among them) refuse the others.
pub async fn set_boot_device(
    t: &Target,
    dev: BootDevice,
    persistent: bool,
    efi: bool,
) -> Result<(), BmcError> {
    run(t, move |s| {
        let locked = s.call(SetBootOption::SetInProgress(IN_PROGRESS)).is_ok();
        let flags = s
            .call(SetBootOption::InfoAck)
            .or_else(|e| match e {
                // Optional: a BMC without the parameter still boots as told.
                BmcError::Protocol(_) => Ok(()),
                e => Err(e),
            })
            .and_then(|()| s.call(SetBootOption::BootFlags(boot_flags(dev, persistent, efi))));
        if locked {
            if flags.is_ok() {
                s.call(SetBootOption::SetInProgress(COMMIT_WRITE)).ok();
            }
            s.call(SetBootOption::SetInProgress(SET_COMPLETE)).ok();
        }
        flags
    })
    .await
}

/// IPMI has no virtual media (vendors put it in OEM web interfaces): the
/// job's next protocol, Redfish, is the one that can.
pub async fn virtual_media(
    _t: &Target,
    kind: super::model::MediaKind,
    _url: &str,
) -> Result<(), BmcError> {
    Err(BmcError::Unsupported(format!(
        "virtual media ({}) is not part of IPMI: give the Machine a Redfish connection (host http(s)://..., or providerOptions.preferredOrder with redfish)",
        kind.as_str()
    )))
}

/// The boot device override as the BMC reports it (Get System Boot Options,
/// parameter 5).
pub async fn boot_device(t: &Target) -> Result<BootOverride, BmcError> {
    run(t, |s| s.call(GetBootFlags)).await
}

/// Boot flags (boot options parameter 5) as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootOverride {
    /// Data 1 bit 7: the override is in effect.
    pub valid: bool,
    /// The device selector, when it is one of Rufio's devices (whatever
    /// `valid` says: some BMCs, ipmi_sim among them, never set it).
    pub device: Option<BootDevice>,
    pub persistent: bool,
    pub efi: bool,
}

// ---------------------------------------------------------------------------
// Running a call: blocking pool, hard deadline, session lifetime.

/// Runs `work` in a fresh admin session on the blocking pool. The caller gets
/// an answer within `t.timeout` whatever the BMC does; the thread itself
/// stops soon after (one socket read timeout), and closes the session after
/// the answer has been handed back so closing never delays it.
async fn run<T, F>(t: &Target, work: F) -> Result<T, BmcError>
where
    T: Send + 'static,
    F: FnOnce(&mut Session) -> Result<T, BmcError> + Send + 'static,
{
    let limit = t.timeout;
    let endpoint = endpoint(&t.host, t.port.unwrap_or(DEFAULT_PORT));
    // A configured timeout too large for `Instant` means "no deadline".
    let deadline = Instant::now()
        .checked_add(limit)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let target = t.clone();
    // Detached on purpose: the thread bounds itself by `deadline`.
    drop(tokio::task::spawn_blocking(move || {
        let mut session = match Session::open(&target, deadline) {
            Ok(s) => s,
            Err(e) => {
                tx.send(Err(e)).ok();
                return;
            }
        };
        let result = session
            .call(SetSessionPrivilege(ADMINISTRATOR))
            .and_then(|()| work(&mut session));
        tx.send(result).ok();
        session.close();
    }));
    match tokio::time::timeout(limit, rx).await {
        Ok(Ok(result)) => result,
        // The thread ended without an answer: only a panic inside ipmi-rs
        // does that (it unwraps a few socket and wire errors).
        Ok(Err(_)) => Err(BmcError::Protocol(format!(
            "IPMI client for {endpoint} failed inside ipmi-rs (panic; see the log)"
        ))),
        Err(_) => Err(BmcError::Timeout(endpoint, limit)),
    }
}

/// `host:port`, bracketing IPv6 literals.
fn endpoint(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// How long one try waits for an answer before resending: short enough for
/// a few tries within the deadline, long enough for a slow BMC (ipmitool's
/// lanplus default is 1 s, 4 tries).
fn try_timeout(limit: Duration) -> Duration {
    (limit / 4).clamp(Duration::from_millis(250), Duration::from_secs(2))
}

/// What to do after an I/O error while waiting for the BMC.
#[derive(Debug, PartialEq, Eq)]
enum IoOutcome {
    /// The read timed out: try again.
    NoAnswer,
    /// ICMP port unreachable (nothing listens yet, or the BMC restarts):
    /// pause, then try again until the deadline.
    Refused,
    /// Anything else (no route, …) will not heal by waiting.
    Fatal,
}

fn io_outcome(e: &io::Error) -> IoOutcome {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => IoOutcome::NoAnswer,
        io::ErrorKind::ConnectionRefused => IoOutcome::Refused,
        _ => IoOutcome::Fatal,
    }
}

/// An RMCP+ session at ADMINISTRATOR privilege, for one call.
struct Session {
    rmcp: Rmcp,
    endpoint: String,
    limit: Duration,
    deadline: Instant,
    try_timeout: Duration,
}

impl Session {
    fn open(t: &Target, deadline: Instant) -> Result<Session, BmcError> {
        check_credentials(&t.username, &t.password)?;
        if t.cipher_suite != CIPHER_SUITE {
            return Err(BmcError::Protocol(format!(
                "IPMI cipher suite {} is not supported: ipmi-rs implements only cipher suite {CIPHER_SUITE} \
                 (HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)",
                t.cipher_suite
            )));
        }
        let port = t.port.unwrap_or(DEFAULT_PORT);
        let endpoint = endpoint(&t.host, port);
        let addr = (t.host.as_str(), port)
            .to_socket_addrs()
            .and_then(|mut a| a.next().ok_or_else(|| io::ErrorKind::NotFound.into()))
            .map_err(|e| io::Error::new(e.kind(), format!("resolving BMC {}: {e}", t.host)))?;
        let try_timeout = try_timeout(t.timeout);
        let timeout = || BmcError::Timeout(endpoint.clone(), t.timeout);

        probe(addr, deadline, try_timeout).map_err(|e| e.into_error(&timeout))?;

        // ipmi-rs sends no retransmissions: a lost datagram fails the whole
        // activation, so start over until the deadline.
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timeout());
            }
            let mut rmcp = Rmcp::new(addr, try_timeout.min(left))?;
            match rmcp.activate(true, Some(&t.username), Some(t.password.as_bytes())) {
                Ok(()) => {
                    tracing::debug!(bmc = %endpoint, "RMCP+ session open");
                    return Ok(Session {
                        rmcp,
                        endpoint,
                        limit: t.timeout,
                        deadline,
                        try_timeout,
                    });
                }
                Err(e) => match activation_outcome(e) {
                    Ok(IoOutcome::Refused) => pause(deadline, try_timeout),
                    Ok(_) => {}
                    Err(e) => return Err(e),
                },
            }
        }
    }

    fn timeout(&self) -> BmcError {
        BmcError::Timeout(self.endpoint.clone(), self.limit)
    }

    /// Send one command and wait for its answer until the deadline. A lost
    /// answer is retried by resending only when sending twice is harmless;
    /// otherwise this keeps listening for a late answer.
    fn call<C: Command>(&mut self, cmd: C) -> Result<C::Output, BmcError> {
        let resend = cmd.resendable();
        let message: Message = cmd.into();
        let (netfn, code) = (message.netfn(), message.cmd());
        let mut send = true;
        loop {
            if Instant::now() >= self.deadline {
                return Err(self.timeout());
            }
            if send {
                let mut request = Request::new(
                    message.clone(),
                    RequestTargetAddress::Bmc(LogicalUnit::Zero),
                );
                self.rmcp.send(&mut request).map_err(|e| {
                    BmcError::Protocol(format!("{}: sending failed: {e:?}", C::NAME))
                })?;
                send = false;
            }
            match self.rmcp.recv() {
                // Anything else is a late answer to an earlier request.
                Ok(response) if response.netfn() == netfn && response.cmd() == code => {
                    return check::<C>(response.cc(), response.data());
                }
                Ok(_) => {}
                Err(RmcpIpmiError::Receive(RmcpIpmiReceiveError::Io(e))) => match io_outcome(&e) {
                    IoOutcome::NoAnswer => send = resend,
                    IoOutcome::Refused => {
                        pause(self.deadline, self.try_timeout);
                        send = resend;
                    }
                    IoOutcome::Fatal => return Err(e.into()),
                },
                Err(RmcpIpmiError::NotActive) => {
                    return Err(BmcError::Protocol("IPMI session is not active".into()));
                }
                // Undecodable or unauthenticated datagrams are dropped, as
                // ipmitool does; the deadline bounds the loop.
                Err(e) => tracing::debug!(bmc = %self.endpoint, error = ?e, "ignoring datagram"),
            }
        }
    }

    /// Close the session so it does not hold one of the BMC's few session
    /// slots until its idle timeout. Best effort: one try, one read timeout.
    fn close(mut self) {
        self.deadline = Instant::now() + self.try_timeout;
        let closed = match session_id(&self.rmcp) {
            Some(id) => self.call(CloseSession::Id(id)),
            None => self
                .call(GetSessionInfo)
                .and_then(|handle| self.call(CloseSession::Handle(handle))),
        };
        if let Err(e) = closed {
            tracing::debug!(bmc = %self.endpoint, error = %e, "closing the IPMI session failed");
        }
    }
}

/// Sleep before retrying after "connection refused" (it comes back at once).
fn pause(deadline: Instant, try_timeout: Duration) {
    let left = deadline.saturating_duration_since(Instant::now());
    std::thread::sleep(left.min(try_timeout));
}

/// ipmi-rs keeps the managed system's session ID private; Close Session by ID
/// is what every BMC implements (ipmi_sim has no close by handle). Its Debug
/// output, which redacts the password and keys, carries the ID.
fn session_id(rmcp: &Rmcp) -> Option<u32> {
    let text = format!("{rmcp:?}");
    let (_, state) = text.split_once("V2_0(")?;
    let (_, rest) = state.split_once("session_id: ")?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok().filter(|&id| id != 0)
}

/// IPMI limits (v2.0 user name 16 bytes, password 20), checked here because
/// ipmi-rs would silently fall back to an empty user name.
fn check_credentials(username: &str, password: &str) -> Result<(), BmcError> {
    if username.len() > 16 || !username.bytes().all(|b| b.is_ascii() && b != 0) {
        return Err(BmcError::Auth(
            "IPMI user name must be at most 16 ASCII characters".into(),
        ));
    }
    if password.len() > 20 {
        return Err(BmcError::Auth("IPMI password longer than 20 bytes".into()));
    }
    Ok(())
}

/// Sorts an ipmi-rs activation failure: `Ok` to try again, `Err` to give up.
fn activation_outcome(e: ActivationError) -> Result<IoOutcome, BmcError> {
    use RmcpIpmiReceiveError as Recv;
    let io = |e: io::Error| match io_outcome(&e) {
        IoOutcome::Fatal => Err(BmcError::Io(e)),
        o => Ok(o),
    };
    let e = match e {
        ActivationError::BindSocket(e) => return Err(BmcError::Io(e)),
        ActivationError::PingSend(e) | ActivationError::PongReceive(e) => return io(e),
        ActivationError::GetChannelAuthenticationCapabilities(IpmiError::Connection(
            RmcpIpmiError::Receive(Recv::Io(e)),
        )) => return io(e),
        ActivationError::V2_0(e) => e,
        ActivationError::V1_5(_) => {
            return Err(BmcError::Protocol(
                "the BMC fell back to IPMI 1.5; only IPMI 2.0 (RMCP+) is used".into(),
            ));
        }
        ActivationError::IpmiNotSupported | ActivationError::NoSupportedIpmiLANVersions => {
            return Err(BmcError::Protocol(
                "the BMC does not support IPMI 2.0 over LAN".into(),
            ));
        }
        e => {
            return Err(BmcError::Protocol(format!(
                "RMCP+ session setup failed: {e:?}"
            )));
        }
    };
    let auth = |why: &str| Err(BmcError::Auth(why.to_string()));
    match e {
        V2Error::Io(e)
        | V2Error::OpenSessionResponseReceive(Recv::Io(e))
        | V2Error::RakpMessage2Receive(Recv::Io(e))
        | V2Error::RakpMessage4Receive(Recv::Io(e)) => io(e),
        V2Error::ServerAuthenticationFailed => {
            auth("wrong password (or user name): the BMC's RAKP message 2 does not verify with it")
        }
        V2Error::RakpMessage4Parse(Rakp4Error::ErrorStatusCode(
            Rakp4Status::InvalidIntegrityCheckValue,
        )) => auth("the BMC rejected RAKP message 3: wrong password"),
        V2Error::RakpMessage4InvalidIntegrityCheckValue => auth(
            "RAKP message 4 does not verify: the BMC uses a BMC key (Kg), which is not supported",
        ),
        V2Error::RakpMessage2Parse(Rakp2Error::ErrorStatusCode(Rakp2Status::UnauthorizedName)) => {
            auth("the BMC does not know this user name")
        }
        V2Error::RakpMessage2Parse(Rakp2Error::ErrorStatusCode(
            Rakp2Status::InvalidRole | Rakp2Status::UnauthorizedRoleOrPrivilegeLevelRequested,
        )) => auth("the user may not log in with ADMINISTRATOR privilege"),
        // ipmi-rs reads the RAKP 2 status from the wrong byte, so a refusal
        // (8 bytes: tag, status, reserved, session ID) shows up as too short.
        V2Error::RakpMessage2Parse(Rakp2Error::NotEnoughData) => auth(
            "the BMC refused the login at RAKP message 2: unknown user name, or the user \
             may not have ADMINISTRATOR privilege",
        ),
        V2Error::OpenSessionResponseParse(ParseSessionResponseError::HaveErrorCode(code)) => {
            Err(BmcError::Protocol(open_session_refusal(&code)))
        }
        V2Error::RakpMessage2Parse(Rakp2Error::ErrorStatusCode(
            Rakp2Status::InsufficientResourcesToCreateSessionAtRequestedRole,
        )) => Err(BmcError::Protocol(
            "the BMC has no free IPMI session slot; try again later".into(),
        )),
        e => Err(BmcError::Protocol(format!(
            "RMCP+ session setup failed: {e:?}"
        ))),
    }
}

/// ipmi-rs does not export the type of the Open Session status code; its
/// Debug output names the variant.
fn open_session_refusal(code: &dyn std::fmt::Debug) -> String {
    let code = format!("{code:?}");
    if code.contains("InsufficientResources") {
        "the BMC has no free IPMI session slot; try again later".into()
    } else if ["CipherSuite", "Algorithm", "Payload"]
        .iter()
        .any(|k| code.contains(k))
    {
        format!("the BMC does not offer cipher suite {CIPHER_SUITE} ({code})")
    } else if code.contains("Role") {
        format!("the BMC does not allow ADMINISTRATOR sessions with cipher suite {CIPHER_SUITE}")
    } else {
        format!("the BMC refused the RMCP+ session: {code}")
    }
}

// ---------------------------------------------------------------------------
// Reachability and capabilities, before any session.

/// A probe failure, with the timeout built by the caller (who knows the
/// endpoint and the configured limit).
#[derive(Debug)]
enum ProbeError {
    Timeout,
    Other(BmcError),
}

impl ProbeError {
    fn into_error(self, timeout: &dyn Fn() -> BmcError) -> BmcError {
        match self {
            ProbeError::Timeout => timeout(),
            ProbeError::Other(e) => e,
        }
    }
}

impl From<io::Error> for ProbeError {
    fn from(e: io::Error) -> Self {
        ProbeError::Other(BmcError::Io(e))
    }
}

/// Get Channel Authentication Capabilities outside a session, on a socket of
/// our own, resent every `try_timeout` until the deadline. It finds out
/// whether the BMC answers at all (ipmi-rs cannot retransmit), and refuses a
/// BMC without RMCP+: ipmi-rs would otherwise fall back to IPMI 1.5, where
/// (without its md5 feature) the password may cross the wire in clear.
fn probe(addr: SocketAddr, deadline: Instant, try_timeout: Duration) -> Result<(), ProbeError> {
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect(addr)?;
    let mut buf = [0u8; 512];
    for seq in (0..64u8).cycle() {
        let window = try_timeout.min(deadline.saturating_duration_since(Instant::now()));
        if window.is_zero() {
            return Err(ProbeError::Timeout);
        }
        let window_end = Instant::now() + window;
        let request = sessionless_request(auth_caps_request(), seq);
        if let Err(e) = socket.send(&request) {
            match io_outcome(&e) {
                IoOutcome::Fatal => return Err(e.into()),
                _ => std::thread::sleep(window),
            }
            continue;
        }
        loop {
            let left = window_end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            socket.set_read_timeout(Some(left))?;
            match socket.recv(&mut buf) {
                Ok(n) => {
                    let Some(reply) = sessionless_reply(&buf[..n]) else {
                        continue;
                    };
                    if reply.netfn != NetFn::App.response_value() || reply.cmd != 0x38 {
                        continue;
                    }
                    return check_auth_caps(reply.cc, &reply.data).map_err(ProbeError::Other);
                }
                Err(e) => match io_outcome(&e) {
                    IoOutcome::NoAnswer => break,
                    IoOutcome::Refused => {
                        std::thread::sleep(window_end.saturating_duration_since(Instant::now()));
                        break;
                    }
                    IoOutcome::Fatal => return Err(e.into()),
                },
            }
        }
    }
    Err(ProbeError::Timeout)
}

fn auth_caps_request() -> Message {
    GetChannelAuthenticationCapabilities::new(Channel::Current, PrivilegeLevel::Administrator)
        .into()
}

/// Accepts a BMC that offers IPMI 2.0 connections without a BMC key.
fn check_auth_caps(cc: u8, data: &[u8]) -> Result<(), BmcError> {
    const NAME: &str = "get channel authentication capabilities";
    if cc != 0 {
        return Err(BmcError::Protocol(describe_cc(NAME, cc, None)));
    }
    let caps: ChannelAuthenticationCapabilities =
        GetChannelAuthenticationCapabilities::parse_success_response(data)
            .map_err(|NotEnoughData| BmcError::Protocol(format!("{NAME}: malformed response")))?;
    if !caps.ipmi2_connections_supported {
        return Err(BmcError::Protocol(
            "the BMC does not offer IPMI 2.0 (RMCP+) on this channel; IPMI 1.5 is not used".into(),
        ));
    }
    if caps.kg_status {
        return Err(BmcError::Protocol(
            "the BMC requires a BMC key (Kg), which ipmi-rs does not support".into(),
        ));
    }
    Ok(())
}

/// One IPMI 1.5 sessionless datagram: RMCP header, session header with
/// authentication type none, then the IPMB message to the BMC (0x20) from
/// remote console software (0x81).
fn sessionless_request(message: Message, seq: u8) -> Vec<u8> {
    let header = [0x20, message.netfn_raw() << 2];
    let mut body = vec![0x81, (seq & 0x3F) << 2, message.cmd()];
    body.extend_from_slice(message.data());
    let mut ipmb = header.to_vec();
    ipmb.push(checksum(&header));
    ipmb.extend_from_slice(&body);
    ipmb.push(checksum(&body));

    let mut packet = vec![0x06, 0x00, 0xFF, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
    // The IPMB message of a request this module builds is always short.
    packet.push(u8::try_from(ipmb.len()).unwrap_or(u8::MAX));
    packet.extend_from_slice(&ipmb);
    packet
}

/// A sessionless answer, as far as the probe needs it.
#[derive(Debug, PartialEq, Eq)]
struct SessionlessReply {
    netfn: u8,
    cmd: u8,
    cc: u8,
    data: Vec<u8>,
}

/// Parses an IPMI 1.5 datagram outside a session; `None` for anything else
/// (RMCP ACKs, ASF, RMCP+ framing, bad lengths or checksums).
fn sessionless_reply(packet: &[u8]) -> Option<SessionlessReply> {
    let (rmcp, rest) = packet.split_at_checked(4)?;
    // Version 6; class IPMI (7) and not an ACK (bit 7).
    if rmcp[0] != 0x06 || rmcp[3] != 0x07 {
        return None;
    }
    let header_len = match *rest.first()? {
        0x00 => 10,
        0x01 | 0x02 | 0x04 | 0x05 => 26,
        _ => return None,
    };
    let (header, rest) = rest.split_at_checked(header_len)?;
    let len = usize::from(*header.last()?);
    let msg = rest.get(..len)?;
    // rqAddr, netFn/rqLUN, checksum, rsAddr, rqSeq/rsLUN, cmd, cc, checksum.
    if msg.len() < 8 {
        return None;
    }
    let (first, second) = msg.split_at(3);
    if checksum(first) != 0 || checksum(second) != 0 {
        return None;
    }
    Some(SessionlessReply {
        netfn: msg[1] >> 2,
        cmd: msg[5],
        cc: msg[6],
        data: msg[7..msg.len() - 1].to_vec(),
    })
}

/// IPMB checksum: the two's complement of the byte sum (a block including
/// its checksum sums to zero).
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, b| sum.wrapping_add(*b))
        .wrapping_neg()
}

// ---------------------------------------------------------------------------
// Commands, on ipmi-rs's `IpmiCommand`.

/// A response this module cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Malformed(&'static str);

/// What `Session::call` needs beyond ipmi-rs's `IpmiCommand`.
trait Command: IpmiCommand<Error = Malformed> {
    /// For error messages, as in the IPMI specification.
    const NAME: &'static str;
    /// Whether a lost answer may be retried by sending the request again.
    fn resendable(&self) -> bool {
        true
    }
    /// The command's own completion codes (0x80..0xBE).
    fn completion_code(_cc: u8) -> Option<&'static str> {
        None
    }
}

/// Completion code and data of a matching response, to the command's output.
fn check<C: Command>(cc: u8, data: &[u8]) -> Result<C::Output, BmcError> {
    if cc != 0 {
        return Err(BmcError::Protocol(describe_cc(
            C::NAME,
            cc,
            C::completion_code(cc),
        )));
    }
    C::parse_success_response(data).map_err(|Malformed(why)| {
        BmcError::Protocol(format!("{}: malformed response: {why}", C::NAME))
    })
}

/// "chassis control: completion code 0xD4 (insufficient privilege)".
fn describe_cc(name: &str, cc: u8, specific: Option<&str>) -> String {
    let meaning = specific.unwrap_or(match cc {
        0xC0 => "node busy",
        0xC1 => "invalid or unsupported command",
        0xC2 => "command invalid for this LUN",
        0xC3 => "timeout while processing the command",
        0xC4 => "out of space",
        0xC5 => "reservation cancelled or invalid",
        0xC6 => "request data truncated",
        0xC7 => "request data length invalid",
        0xC8 => "request data field length limit exceeded",
        0xC9 => "parameter out of range",
        0xCA => "cannot return the number of requested bytes",
        0xCB => "requested sensor, data or record not present",
        0xCC => "invalid data field in request",
        0xCD => "command illegal for this sensor or record type",
        0xCE => "response could not be provided",
        0xCF => "duplicated request",
        0xD0 => "SDR repository in update mode",
        0xD1 => "device in firmware update mode",
        0xD2 => "BMC initialization in progress",
        0xD3 => "destination unavailable",
        0xD4 => "insufficient privilege",
        0xD5 => "not supported in the present state",
        0xD6 => "sub-function disabled or unavailable",
        0xFF => "unspecified error",
        0x01..=0x7E => "OEM completion code",
        0x80..=0xBE => "command-specific completion code",
        _ => "reserved completion code",
    });
    format!("{name}: completion code 0x{cc:02X} ({meaning})")
}

/// Set Session Privilege Level (App 0x3B). An RMCP+ session starts at USER
/// (or below) whatever was negotiated; chassis control needs ADMINISTRATOR.
struct SetSessionPrivilege(u8);

impl From<SetSessionPrivilege> for Message {
    fn from(c: SetSessionPrivilege) -> Message {
        Message::new_request(NetFn::App, 0x3B, vec![c.0])
    }
}

impl IpmiCommand for SetSessionPrivilege {
    type Output = ();
    type Error = Malformed;

    fn parse_success_response(data: &[u8]) -> Result<(), Malformed> {
        match data.first() {
            Some(level) if level & 0x0F == ADMINISTRATOR => Ok(()),
            Some(_) => Err(Malformed(
                "the BMC granted a privilege level other than ADMINISTRATOR",
            )),
            None => Err(Malformed("no privilege level")),
        }
    }
}

impl Command for SetSessionPrivilege {
    const NAME: &'static str = "set session privilege level";

    fn completion_code(cc: u8) -> Option<&'static str> {
        match cc {
            0x80 => Some("requested level not available for this user"),
            0x81 => Some("requested level exceeds the user's or the channel's privilege limit"),
            0x82 => Some("cannot disable user level authentication"),
            _ => None,
        }
    }
}

/// Get Chassis Status (Chassis 0x01).
struct GetChassisStatus;

/// Byte 1 of Get Chassis Status: current power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChassisStatus {
    power_on: bool,
    overload: bool,
    interlock: bool,
    power_fault: bool,
    control_fault: bool,
}

impl ChassisStatus {
    fn power_state(self) -> PowerState {
        if self.power_fault || self.control_fault || self.overload || self.interlock {
            tracing::debug!(status = ?self, "chassis reports a power problem");
        }
        if self.power_on {
            PowerState::On
        } else {
            PowerState::Off
        }
    }
}

impl From<GetChassisStatus> for Message {
    fn from(_: GetChassisStatus) -> Message {
        Message::new_request(NetFn::Chassis, 0x01, Vec::new())
    }
}

impl IpmiCommand for GetChassisStatus {
    type Output = ChassisStatus;
    type Error = Malformed;

    /// Bytes 2 and 3 (last power event, misc state) are mandatory in the
    /// specification but unused here, so a short answer is accepted.
    fn parse_success_response(data: &[u8]) -> Result<ChassisStatus, Malformed> {
        let state = *data.first().ok_or(Malformed("no current power state"))?;
        Ok(ChassisStatus {
            power_on: state & 0x01 != 0,
            overload: state & 0x02 != 0,
            interlock: state & 0x04 != 0,
            power_fault: state & 0x08 != 0,
            control_fault: state & 0x10 != 0,
        })
    }
}

impl Command for GetChassisStatus {
    const NAME: &'static str = "get chassis status";
}

/// Chassis Control (Chassis 0x02) with its control code.
struct ChassisControl(u8);

/// Rufio's power actions as chassis control codes; `None` for status.
fn control_code(action: PowerAction) -> Option<u8> {
    match action {
        PowerAction::Off => Some(0x00),
        PowerAction::On => Some(0x01),
        PowerAction::Cycle => Some(0x02),
        PowerAction::Reset => Some(0x03),
        // Soft-shutdown through ACPI (an emulated fatal overtemperature).
        PowerAction::Soft => Some(0x05),
        PowerAction::Status => None,
    }
}

impl From<ChassisControl> for Message {
    fn from(c: ChassisControl) -> Message {
        Message::new_request(NetFn::Chassis, 0x02, vec![c.0])
    }
}

impl IpmiCommand for ChassisControl {
    type Output = ();
    type Error = Malformed;

    fn parse_success_response(_: &[u8]) -> Result<(), Malformed> {
        Ok(())
    }
}

impl Command for ChassisControl {
    const NAME: &'static str = "chassis control";

    /// On and off are idempotent; a second cycle, reset or soft-off is not.
    fn resendable(&self) -> bool {
        self.0 <= 0x01
    }
}

/// Set System Boot Options (Chassis 0x08): the parameters `ipmitool chassis
/// bootdev` writes.
enum SetBootOption {
    /// Parameter 0, set-in-progress.
    SetInProgress(u8),
    /// Parameter 4, boot info acknowledge: clear "BIOS/POST has handled the
    /// boot flags", so the BIOS acts on the new ones.
    InfoAck,
    /// Parameter 5, boot flags.
    BootFlags([u8; 5]),
}

const SET_COMPLETE: u8 = 0x00;
const IN_PROGRESS: u8 = 0x01;
const COMMIT_WRITE: u8 = 0x02;

impl From<SetBootOption> for Message {
    fn from(c: SetBootOption) -> Message {
        // Byte 1 bit 7 clear: mark the parameter valid/unlocked.
        let data = match c {
            SetBootOption::SetInProgress(v) => vec![0x00, v],
            SetBootOption::InfoAck => vec![0x04, 0x01, 0x01],
            SetBootOption::BootFlags(f) => [&[0x05][..], &f[..]].concat(),
        };
        Message::new_request(NetFn::Chassis, 0x08, data)
    }
}

impl IpmiCommand for SetBootOption {
    type Output = ();
    type Error = Malformed;

    fn parse_success_response(_: &[u8]) -> Result<(), Malformed> {
        Ok(())
    }
}

impl Command for SetBootOption {
    const NAME: &'static str = "set system boot options";

    fn completion_code(cc: u8) -> Option<&'static str> {
        match cc {
            0x80 => Some("parameter not supported"),
            0x81 => Some("set in progress by another client"),
            0x82 => Some("parameter is read-only"),
            _ => None,
        }
    }
}

/// Boot flags (IPMI 2.0 table 28-14, parameter 5). Data 1: bit 7 valid, bit
/// 6 persistent (else next boot only), bit 5 EFI (else PC-compatible). Data
/// 2 bits 5:2: device selector. Data 3-5: no console, BIOS or instance
/// overrides.
fn boot_flags(dev: BootDevice, persistent: bool, efi: bool) -> [u8; 5] {
    let mut data1 = 0x80;
    if persistent {
        data1 |= 0x40;
    }
    if efi {
        data1 |= 0x20;
    }
    [data1, device_selector(dev) << 2, 0, 0, 0]
}

/// Device selectors (data 2 bits 5:2), as `ipmitool chassis bootdev`.
fn device_selector(dev: BootDevice) -> u8 {
    match dev {
        BootDevice::Pxe => 0x1,   // force PXE
        BootDevice::Disk => 0x2,  // force boot from default hard drive
        BootDevice::Cdrom => 0x5, // force boot from default CD/DVD
        BootDevice::Bios => 0x6,  // force boot into BIOS setup
    }
}

fn device_from_selector(selector: u8) -> Option<BootDevice> {
    match selector {
        0x1 => Some(BootDevice::Pxe),
        0x2 => Some(BootDevice::Disk),
        0x5 => Some(BootDevice::Cdrom),
        0x6 => Some(BootDevice::Bios),
        _ => None,
    }
}

/// Get System Boot Options (Chassis 0x09) for parameter 5.
struct GetBootFlags;

impl From<GetBootFlags> for Message {
    fn from(_: GetBootFlags) -> Message {
        // Parameter 5, set selector 0, block selector 0.
        Message::new_request(NetFn::Chassis, 0x09, vec![0x05, 0x00, 0x00])
    }
}

impl IpmiCommand for GetBootFlags {
    type Output = BootOverride;
    type Error = Malformed;

    /// Parameter version, parameter valid/selector, then the five flag bytes.
    fn parse_success_response(data: &[u8]) -> Result<BootOverride, Malformed> {
        let [_version, selector, data1, data2, ..] = *data else {
            return Err(Malformed("shorter than the boot flags"));
        };
        if selector & 0x7F != 0x05 {
            return Err(Malformed("not boot options parameter 5"));
        }
        Ok(BootOverride {
            valid: data1 & 0x80 != 0,
            persistent: data1 & 0x40 != 0,
            efi: data1 & 0x20 != 0,
            device: device_from_selector((data2 >> 2) & 0x0F),
        })
    }
}

impl Command for GetBootFlags {
    const NAME: &'static str = "get system boot options";

    fn completion_code(cc: u8) -> Option<&'static str> {
        (cc == 0x80).then_some("parameter not supported")
    }
}

/// Get Session Info (App 0x3D) for this session: its handle.
struct GetSessionInfo;

impl From<GetSessionInfo> for Message {
    fn from(_: GetSessionInfo) -> Message {
        Message::new_request(NetFn::App, 0x3D, vec![0x00])
    }
}

impl IpmiCommand for GetSessionInfo {
    type Output = u8;
    type Error = Malformed;

    fn parse_success_response(data: &[u8]) -> Result<u8, Malformed> {
        match data.first() {
            Some(0) | None => Err(Malformed("no session handle")),
            Some(handle) => Ok(*handle),
        }
    }
}

impl Command for GetSessionInfo {
    const NAME: &'static str = "get session info";
}

/// Close Session (App 0x3C), by session ID or (ID 0) by handle.
enum CloseSession {
    Id(u32),
    Handle(u8),
}

impl From<CloseSession> for Message {
    fn from(c: CloseSession) -> Message {
        let data = match c {
            CloseSession::Id(id) => id.to_le_bytes().to_vec(),
            CloseSession::Handle(h) => vec![0, 0, 0, 0, h],
        };
        Message::new_request(NetFn::App, 0x3C, data)
    }
}

impl IpmiCommand for CloseSession {
    type Output = ();
    type Error = Malformed;

    fn parse_success_response(_: &[u8]) -> Result<(), Malformed> {
        Ok(())
    }
}

impl Command for CloseSession {
    const NAME: &'static str = "close session";

    /// The session may already be gone when a retry arrives.
    fn resendable(&self) -> bool {
        false
    }

    fn completion_code(cc: u8) -> Option<&'static str> {
        match cc {
            0x87 => Some("invalid session ID"),
            0x88 => Some("invalid session handle"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(m: impl Into<Message>) -> (u8, u8, Vec<u8>) {
        let m = m.into();
        (m.netfn_raw(), m.cmd(), m.data().to_vec())
    }

    #[test]
    fn chassis_control_requests() {
        let expect = [
            (PowerAction::Off, 0x00),
            (PowerAction::On, 0x01),
            (PowerAction::Cycle, 0x02),
            (PowerAction::Reset, 0x03),
            (PowerAction::Soft, 0x05),
        ];
        for (action, code) in expect {
            assert_eq!(control_code(action), Some(code), "{action:?}");
            assert_eq!(bytes(ChassisControl(code)), (0x00, 0x02, vec![code]));
        }
        assert_eq!(control_code(PowerAction::Status), None);
        assert!(ChassisControl(0x00).resendable());
        assert!(ChassisControl(0x01).resendable());
        for code in [0x02, 0x03, 0x05] {
            assert!(!ChassisControl(code).resendable(), "{code}");
        }
        assert_eq!(bytes(GetChassisStatus), (0x00, 0x01, vec![]));
    }

    #[test]
    fn boot_flags_every_device_and_flag() {
        let devices = [
            (BootDevice::Pxe, 0x04),
            (BootDevice::Disk, 0x08),
            (BootDevice::Cdrom, 0x14),
            (BootDevice::Bios, 0x18),
        ];
        for (dev, data2) in devices {
            for (persistent, efi, data1) in [
                (false, false, 0x80),
                (true, false, 0xC0),
                (false, true, 0xA0),
                (true, true, 0xE0),
            ] {
                let flags = boot_flags(dev, persistent, efi);
                assert_eq!(flags, [data1, data2, 0, 0, 0], "{dev:?} {persistent} {efi}");
                assert_eq!(
                    bytes(SetBootOption::BootFlags(flags)),
                    (0x00, 0x08, vec![0x05, data1, data2, 0, 0, 0])
                );
                // What a BMC that stores the flags reports back.
                let read =
                    GetBootFlags::parse_success_response(&[0x01, 0x05, data1, data2, 0, 0, 0]);
                assert_eq!(
                    read,
                    Ok(BootOverride {
                        valid: true,
                        device: Some(dev),
                        persistent,
                        efi
                    })
                );
            }
        }
    }

    #[test]
    fn boot_option_sequence_requests() {
        assert_eq!(
            bytes(SetBootOption::SetInProgress(IN_PROGRESS)),
            (0x00, 0x08, vec![0x00, 0x01])
        );
        assert_eq!(
            bytes(SetBootOption::SetInProgress(COMMIT_WRITE)),
            (0x00, 0x08, vec![0x00, 0x02])
        );
        assert_eq!(
            bytes(SetBootOption::SetInProgress(SET_COMPLETE)),
            (0x00, 0x08, vec![0x00, 0x00])
        );
        assert_eq!(
            bytes(SetBootOption::InfoAck),
            (0x00, 0x08, vec![0x04, 0x01, 0x01])
        );
        assert_eq!(bytes(GetBootFlags), (0x00, 0x09, vec![0x05, 0x00, 0x00]));
    }

    #[test]
    fn session_requests() {
        assert_eq!(
            bytes(SetSessionPrivilege(ADMINISTRATOR)),
            (0x06, 0x3B, vec![0x04])
        );
        assert_eq!(
            bytes(CloseSession::Id(0x1234_5678)),
            (0x06, 0x3C, vec![0x78, 0x56, 0x34, 0x12])
        );
        assert_eq!(
            bytes(CloseSession::Handle(3)),
            (0x06, 0x3C, vec![0, 0, 0, 0, 3])
        );
        assert_eq!(bytes(GetSessionInfo), (0x06, 0x3D, vec![0x00]));
        assert!(!CloseSession::Id(1).resendable());
    }

    #[test]
    fn chassis_status_bits() {
        let parse = GetChassisStatus::parse_success_response;
        let on = parse(&[0x01, 0x00, 0x00]).unwrap();
        assert_eq!(on.power_state(), PowerState::On);
        assert!(!on.power_fault && !on.overload && !on.interlock && !on.control_fault);
        // Restore policy bits (6:5) and faults do not change the state.
        assert_eq!(
            parse(&[0x60, 0, 0, 0]).unwrap().power_state(),
            PowerState::Off
        );
        let faulty = parse(&[0x1F]).unwrap();
        assert_eq!(
            faulty,
            ChassisStatus {
                power_on: true,
                overload: true,
                interlock: true,
                power_fault: true,
                control_fault: true
            }
        );
        assert_eq!(parse(&[0x08]).unwrap().power_state(), PowerState::Off);
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn boot_flags_readback() {
        let parse = GetBootFlags::parse_success_response;
        // ipmi_sim: device only, flags byte never set.
        assert_eq!(
            parse(&[0x01, 0x05, 0x00, 0x04, 0, 0, 0]),
            Ok(BootOverride {
                valid: false,
                device: Some(BootDevice::Pxe),
                persistent: false,
                efi: false
            })
        );
        // No override, and devices outside Rufio's set.
        for data2 in [0x00, 0x0C, 0x10, 0x3C] {
            assert_eq!(
                parse(&[0x01, 0x05, 0x80, data2, 0, 0, 0]).unwrap().device,
                None
            );
        }
        // Parameter marked invalid/locked (bit 7) is still parameter 5.
        assert!(parse(&[0x01, 0x85, 0x80, 0x04, 0, 0, 0]).is_ok());
        assert!(parse(&[0x01, 0x04, 0x80, 0x04, 0, 0, 0]).is_err());
        assert!(parse(&[0x01, 0x05, 0x80]).is_err());
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn set_privilege_response() {
        let parse = SetSessionPrivilege::parse_success_response;
        assert_eq!(parse(&[0x04]), Ok(()));
        assert!(parse(&[0x02]).is_err());
        assert!(parse(&[]).is_err());
        assert_eq!(GetSessionInfo::parse_success_response(&[2, 63, 1]), Ok(2));
        assert!(GetSessionInfo::parse_success_response(&[0, 63, 1]).is_err());
    }

    #[test]
    fn completion_codes() {
        assert_eq!(
            check::<ChassisControl>(0xD4, &[]).unwrap_err().to_string(),
            "chassis control: completion code 0xD4 (insufficient privilege)"
        );
        assert_eq!(
            check::<SetSessionPrivilege>(0x81, &[])
                .unwrap_err()
                .to_string(),
            "set session privilege level: completion code 0x81 (requested level exceeds \
             the user's or the channel's privilege limit)"
        );
        assert_eq!(
            check::<SetBootOption>(0x80, &[]).unwrap_err().to_string(),
            "set system boot options: completion code 0x80 (parameter not supported)"
        );
        assert_eq!(
            check::<GetChassisStatus>(0x85, &[])
                .unwrap_err()
                .to_string(),
            "get chassis status: completion code 0x85 (command-specific completion code)"
        );
        assert_eq!(
            check::<GetChassisStatus>(0xCC, &[])
                .unwrap_err()
                .to_string(),
            "get chassis status: completion code 0xCC (invalid data field in request)"
        );
        assert_eq!(
            check::<GetChassisStatus>(0xFF, &[])
                .unwrap_err()
                .to_string(),
            "get chassis status: completion code 0xFF (unspecified error)"
        );
        assert!(matches!(
            check::<GetChassisStatus>(0x00, &[]),
            Err(BmcError::Protocol(m)) if m == "get chassis status: malformed response: no current power state"
        ));
        assert_eq!(
            check::<GetChassisStatus>(0x00, &[0x01])
                .unwrap()
                .power_state(),
            PowerState::On
        );
    }

    #[test]
    fn sessionless_probe_bytes() {
        let packet = sessionless_request(auth_caps_request(), 0);
        // As ipmitool sends it (seen in ipmi_sim's debug output).
        assert_eq!(
            packet,
            [
                0x06, 0x00, 0xFF, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x09, 0x20, 0x18, 0xC8, 0x81,
                0x00, 0x38, 0x8E, 0x04, 0xB5
            ]
        );
        assert_eq!(sessionless_request(auth_caps_request(), 5)[18], 5 << 2);
    }

    /// A Get Channel Authentication Capabilities answer from `data`.
    fn caps_reply(cc: u8, data: &[u8]) -> Vec<u8> {
        let head = [0x81, 0x07 << 2];
        let mut body = vec![0x20, 0x00, 0x38, cc];
        body.extend_from_slice(data);
        let mut msg = head.to_vec();
        msg.push(checksum(&head));
        msg.extend_from_slice(&body);
        msg.push(checksum(&body));
        let mut p = vec![0x06, 0x00, 0xFF, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
        p.push(msg.len() as u8);
        p.extend_from_slice(&msg);
        p
    }

    #[test]
    fn sessionless_reply_parsing() {
        // ipmi_sim's answer: IPMI 2.0 extended data, v1.5 and v2.0 supported.
        let data = [0x01, 0x96, 0x04, 0x03, 0, 0, 0, 0];
        let reply = sessionless_reply(&caps_reply(0, &data)).unwrap();
        assert_eq!(
            reply,
            SessionlessReply {
                netfn: 0x07,
                cmd: 0x38,
                cc: 0,
                data: data.to_vec()
            }
        );
        assert!(check_auth_caps(reply.cc, &reply.data).is_ok());

        // Bad checksum, truncation, ACK, ASF: not ours.
        let mut bad = caps_reply(0, &data);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(sessionless_reply(&bad), None);
        let good = caps_reply(0, &data);
        for n in 0..good.len() {
            assert_eq!(sessionless_reply(&good[..n]), None, "{n}");
        }
        let mut ack = good.clone();
        ack[3] = 0x87;
        assert_eq!(sessionless_reply(&ack), None);
        assert_eq!(
            sessionless_reply(&[0x06, 0x00, 0xFF, 0x06, 0, 0, 0x11, 0xBE]),
            None
        );
    }

    #[test]
    fn auth_caps_policy() {
        // IPMI 1.5 only (no extended data): refused.
        let e = check_auth_caps(0, &[0x01, 0x16, 0x04, 0, 0, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("IPMI 2.0"), "{e}");
        // Extended data but v1.5 connections only.
        assert!(check_auth_caps(0, &[0x01, 0x96, 0x04, 0x01, 0, 0, 0, 0]).is_err());
        // Kg set.
        let e = check_auth_caps(0, &[0x01, 0x96, 0x24, 0x02, 0, 0, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("Kg"), "{e}");
        let e = check_auth_caps(0xCC, &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "get channel authentication capabilities: completion code 0xCC (invalid data field in request)"
        );
        assert!(check_auth_caps(0, &[0x01, 0x96]).is_err());
    }

    #[test]
    fn credentials_and_helpers() {
        assert!(check_credentials("admin", "12345678901234567890").is_ok());
        assert!(matches!(
            check_credentials("a-very-long-user-name", "x"),
            Err(BmcError::Auth(_))
        ));
        assert!(matches!(
            check_credentials("ädmin", "x"),
            Err(BmcError::Auth(_))
        ));
        assert!(matches!(
            check_credentials("admin", "123456789012345678901"),
            Err(BmcError::Auth(_))
        ));
        assert_eq!(endpoint("10.0.0.1", 623), "10.0.0.1:623");
        assert_eq!(endpoint("fd00::1", 623), "[fd00::1]:623");
        assert_eq!(endpoint("bmc.example", 6230), "bmc.example:6230");
        assert_eq!(try_timeout(Duration::from_secs(30)), Duration::from_secs(2));
        assert_eq!(
            try_timeout(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            try_timeout(Duration::from_millis(100)),
            Duration::from_millis(250)
        );
        assert_eq!(checksum(&[0x20, 0x18]), 0xC8);
        assert_eq!(
            io_outcome(&io::ErrorKind::WouldBlock.into()),
            IoOutcome::NoAnswer
        );
        assert_eq!(
            io_outcome(&io::ErrorKind::ConnectionRefused.into()),
            IoOutcome::Refused
        );
        assert_eq!(
            io_outcome(&io::ErrorKind::PermissionDenied.into()),
            IoOutcome::Fatal
        );
    }

    #[test]
    fn activation_errors() {
        let e = activation_outcome(ActivationError::V2_0(V2Error::ServerAuthenticationFailed));
        assert!(matches!(e, Err(BmcError::Auth(m)) if m.contains("wrong password")));
        let e = activation_outcome(ActivationError::V2_0(V2Error::RakpMessage2Parse(
            Rakp2Error::NotEnoughData,
        )));
        assert!(matches!(e, Err(BmcError::Auth(m)) if m.contains("user name")));
        let e = activation_outcome(ActivationError::V2_0(V2Error::OpenSessionResponseParse(
            ParseSessionResponseError::HaveErrorCode(Err(0x42)),
        )));
        assert!(matches!(e, Err(BmcError::Protocol(m)) if m.contains("Err(66)")));
        assert_eq!(
            open_session_refusal(&"Ok(NoMatchingCipherSuite)"),
            "the BMC does not offer cipher suite 3 (\"Ok(NoMatchingCipherSuite)\")"
        );
        assert!(
            open_session_refusal(&"Ok(CommonRakp(InsufficientResourcesForSessionCreation))")
                .contains("no free IPMI session slot")
        );
        let timeout = activation_outcome(ActivationError::PongReceive(
            io::ErrorKind::WouldBlock.into(),
        ));
        assert_eq!(timeout.unwrap(), IoOutcome::NoAnswer);
        let refused = activation_outcome(ActivationError::V2_0(V2Error::RakpMessage2Receive(
            RmcpIpmiReceiveError::Io(io::ErrorKind::ConnectionRefused.into()),
        )));
        assert_eq!(refused.unwrap(), IoOutcome::Refused);
        assert!(matches!(
            activation_outcome(ActivationError::IpmiNotSupported),
            Err(BmcError::Protocol(_))
        ));
    }
}
