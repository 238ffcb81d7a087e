//! The connection to Tink's gRPC API: plain HTTP/2, or TLS through our own
//! rustls connector, because tonic's TLS config cannot skip verification
//! and `tinkerbell_insecure_tls=true` (a lab's self-signed certificate) is
//! what HookOS users set.

use crate::config::Options;
use crate::pb::workflow_service_client::WorkflowServiceClient;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

pub type Client = WorkflowServiceClient<Channel>;

/// Every call's deadline; a poll is tiny, a report is one small write.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A lazily connected client: the first call dials, a broken connection
/// is dialled again by the next call.
pub fn client(o: &Options) -> anyhow::Result<Client> {
    let scheme = if o.tls { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{}", o.authority))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = if o.tls {
        let config = Arc::new(tls_config(o.insecure_tls)?);
        let host = o
            .authority
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string())
            .unwrap_or_default();
        let connector = tower::service_fn(move |uri: Uri| {
            let config = config.clone();
            let host = host.clone();
            async move {
                let addr = uri
                    .authority()
                    .map(|a| a.as_str().to_string())
                    .ok_or_else(|| anyhow::anyhow!("no authority in {uri}"))?;
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let name = rustls::pki_types::ServerName::try_from(host)?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                Ok::<_, anyhow::Error>(TokioIo::new(tls))
            }
        });
        endpoint.connect_with_connector_lazy(connector)
    } else {
        endpoint.connect_lazy()
    };
    Ok(WorkflowServiceClient::new(channel))
}

fn tls_config(insecure: bool) -> anyhow::Result<rustls::ClientConfig> {
    let (mut config, roots) = rustls_config(insecure)?;
    if !insecure && roots == 0 {
        anyhow::bail!(
            "tinkerbell_tls=true but no CA certificates were found (SSL_CERT_FILE, /etc/ssl/certs); \
             add them to the OSIE or set tinkerbell_insecure_tls=true"
        );
    }
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A rustls client config with the system's CA certificates (none in a
/// bare OSIE: then only plain HTTP and `insecure` work), or with no
/// verification at all; and how many roots it has.
pub fn rustls_config(insecure: bool) -> anyhow::Result<(rustls::ClientConfig, usize)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    if insecure {
        let c = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth();
        return Ok((c, 0));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A bad certificate in the system store is skipped, as curl does.
        let _ = roots.add(cert);
    }
    let n = roots.len();
    Ok((
        builder.with_root_certificates(roots).with_no_client_auth(),
        n,
    ))
}

/// `tinkerbell_insecure_tls=true`: any certificate is accepted, the
/// handshake's signatures are still checked.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
