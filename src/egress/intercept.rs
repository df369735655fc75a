//! Index credentials added on the way out, so that install jobs never hold
//! them (issue 42 §2).
//!
//! An installer is given its index's URL without `user:password@` and a CA
//! bundle holding, besides the roots it trusts anyway, a CA this server
//! minted at start. When it asks the proxy to `CONNECT` to a host whose
//! index has credentials, the proxy ends its TLS with a certificate for
//! that host signed by that CA, reads each HTTP/1.1 request, and sends it on
//! over its own TLS connection to the real host (verified against the
//! system's roots and the operator's CA bundle) with `Authorization` set.
//! Only `GET` and `HEAD` are sent on: installs read an index, and code in
//! an install job must not publish to it with the operator's credentials.
//!
//! Why this rather than a loopback index front that rewrites pages: the
//! installer still speaks to the index's own URLs, so pages (HTML and
//! JSON), redirects and file links on the host need no rewriting, and TLS
//! is still checked end to end by both installers. The CA's key never
//! leaves this process's memory; its certificate is public.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine;
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep, timeout};

use super::credentials::{IndexCredential, choose};
use super::{EgressConfig, Host};

type Body = BoxBody<Bytes, hyper::Error>;

/// The minted CA, the certificates it made per host, and how the real
/// hosts are reached.
pub struct Interceptor {
    credentials: Vec<IndexCredential>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    upstream_tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Interceptor {
    /// Mints the CA. `operator_ca` (pip's `cert`) is trusted for the real
    /// hosts besides the system's roots.
    pub fn new(
        credentials: Vec<IndexCredential>,
        operator_ca: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate().context("cannot make a key for the index CA")?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            "ferrepl index credentials (this server only)",
        );
        let ca = params.self_signed(&key)?;
        let upstream_tls = upstream_tls(operator_ca)?;
        Ok(Interceptor {
            credentials,
            ca_pem: ca.pem(),
            issuer: rcgen::Issuer::new(params, key),
            leaves: Mutex::new(HashMap::new()),
            upstream_tls,
        })
    }

    /// What an installer trusts: the operator's bundle (or the system's
    /// roots) and this server's CA, as PEM.
    pub fn trust_bundle(&self, operator_ca: Option<&Path>) -> anyhow::Result<String> {
        let mut pem = String::new();
        match operator_ca {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
                pem.push_str(&text);
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    pem.push_str(&pem_of(&cert));
                }
            }
        }
        if !pem.ends_with('\n') && !pem.is_empty() {
            pem.push('\n');
        }
        pem.push_str(&self.ca_pem);
        Ok(pem)
    }

    /// Whether a tunnel to `host:port` is ended here (its index has
    /// credentials).
    pub(crate) fn covers(&self, host: &Host, port: u16) -> bool {
        choose(&self.credentials, host, port, "/").is_some()
    }

    /// The TLS settings of a tunnel to `host`: a certificate for it,
    /// made once.
    fn leaf(&self, host: &Host) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let name = match host {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = leaves.get(&name) {
            return Ok(found.clone());
        }
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![name.clone()])?;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        let key = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| anyhow::anyhow!("the minted key: {e}"))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(name, config.clone());
        Ok(config)
    }

    /// Serves one intercepted tunnel: the client's TLS ended here, its
    /// requests sent on to `upstream` with the credentials. Every wait is
    /// bounded by the proxy's timeouts.
    pub(crate) async fn serve<S>(
        &self,
        client: S,
        upstream: TcpStream,
        host: &Host,
        port: u16,
        cfg: &EgressConfig,
    ) -> anyhow::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.leaf(host)?);
        let client = timeout(
            cfg.head_timeout,
            acceptor.accept(Idle::new(client, cfg.idle_timeout)),
        )
        .await
        .context("the installer's TLS handshake timed out")?
        .context("the installer's TLS handshake failed")?;
        let server_name = match host {
            Host::Name(n) => ServerName::try_from(n.clone())?,
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let connector = tokio_rustls::TlsConnector::from(self.upstream_tls.clone());
        let upstream = timeout(
            cfg.connect_timeout,
            connector.connect(server_name, Idle::new(upstream, cfg.idle_timeout)),
        )
        .await
        .with_context(|| format!("the TLS handshake with {host} timed out"))?
        .with_context(|| format!("the TLS handshake with {host} failed"))?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(upstream))
                .await?;
        let connection = AbortOnDrop(tokio::spawn(connection));
        let sender = tokio::sync::Mutex::new(sender);
        let authority = if port == 443 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        let forward = Forward {
            interceptor: self,
            sender: &sender,
            host,
            port,
            authority: &authority,
            wait: cfg.idle_timeout,
        };
        let service = hyper::service::service_fn(|req| forward.one(req));
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(cfg.head_timeout)
            .serve_connection(TokioIo::new(client), service)
            .await;
        drop(connection);
        served.map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// The TLS settings of connections to the real indexes.
fn upstream_tls(operator_ca: Option<&Path>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = operator_ca {
        let certs = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
        for cert in certs.flatten() {
            let _ = roots.add(cert);
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn pem_of(cert: &CertificateDer<'_>) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Headers that describe one hop, never sent on; and what a client might
/// say for itself that only the proxy may.
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "cookie",
    "content-length",
    "expect",
];

struct Forward<'a> {
    interceptor: &'a Interceptor,
    sender: &'a tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>,
    host: &'a Host,
    port: u16,
    authority: &'a str,
    wait: Duration,
}

impl Forward<'_> {
    async fn one(&self, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        Ok(self
            .send(req)
            .await
            .unwrap_or_else(|(status, why)| answer(status, why)))
    }

    async fn send(&self, req: Request<Incoming>) -> Result<Response<Body>, (StatusCode, String)> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            crate::metrics::egress_refusal(crate::metrics::EgressRefusal::Method);
            return Err((
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "ferrepl: installs only read the index; {} is not sent to {} with the operator's credentials",
                    req.method(),
                    self.host
                ),
            ));
        }
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let credential = choose(
            &self.interceptor.credentials,
            self.host,
            self.port,
            req.uri().path(),
        )
        .ok_or_else(|| {
            (
                StatusCode::BAD_GATEWAY,
                "ferrepl: no credentials for this host".to_string(),
            )
        })?;
        let mut out = Request::builder().method(req.method()).uri(&path);
        for (name, value) in req.headers() {
            if !NOT_FORWARDED.contains(&name.as_str()) {
                out = out.header(name, value);
            }
        }
        let out = out
            .header(header::HOST, self.authority)
            .header(header::AUTHORIZATION, credential.authorization())
            .body(Empty::new())
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("ferrepl: {e}")))?;
        let sent = async {
            let mut sender = self.sender.lock().await;
            sender.ready().await?;
            sender.send_request(out).await
        };
        let response = match timeout(self.wait, sent).await {
            Err(_) => {
                return Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "ferrepl: {} did not answer within {:?}",
                        self.host, self.wait
                    ),
                ));
            }
            Ok(Err(e)) => {
                return Err((
                    StatusCode::BAD_GATEWAY,
                    format!("ferrepl: {}: {e}", self.host),
                ));
            }
            Ok(Ok(r)) => r,
        };
        let (mut parts, body) = response.into_parts();
        for name in [
            "connection",
            "keep-alive",
            "transfer-encoding",
            "upgrade",
            "trailer",
            "proxy-authenticate",
        ] {
            parts.headers.remove(name);
        }
        Ok(Response::from_parts(parts, body.boxed()))
    }
}

fn answer(status: StatusCode, why: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(why + "\n"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A stream that fails once neither direction has moved a byte for
/// `idle`: a stalled index or installer gives back its connection.
struct Idle<S> {
    inner: S,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<S> Idle<S> {
    fn new(inner: S, idle: Duration) -> Self {
        Idle {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn moved(&mut self) {
        let idle = self.idle;
        self.timer.as_mut().reset(Instant::now() + idle);
    }

    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.moved();
                Poll::Ready(r)
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "idle for too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.check(cx, polled)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, polled)
    }
}

#[cfg(test)]
#[path = "intercept_tests.rs"]
mod tests;
