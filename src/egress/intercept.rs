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

use super::credentials::{IndexCredential, choose, on_host, plain_path};
use super::{EgressConfig, Host};

type Body = BoxBody<Bytes, hyper::Error>;

/// A new connection to the real host (the proxy's checked connect).
pub(crate) type Connect<'a> = &'a (
        dyn Fn()
    -> Pin<Box<dyn std::future::Future<Output = Result<TcpStream, String>> + Send + 'a>>
            + Send
            + Sync
    );

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
        // Good for the credentialed hosts only, whoever holds the key.
        let mut permitted = Vec::new();
        for c in &credentials {
            permitted.push(match c.host() {
                Host::Name(n) => rcgen::GeneralSubtree::DnsName(n.clone()),
                Host::Ip(ip) => rcgen::GeneralSubtree::IpAddress(
                    rcgen::CidrSubnet::from_addr_prefix(*ip, if ip.is_ipv4() { 32 } else { 128 }),
                ),
            });
        }
        params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
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

    /// What an installer trusts: the certificates of the operator's bundle
    /// (or the system's roots; nothing else a bundle file may hold) and
    /// this server's CA, as PEM.
    pub fn trust_bundle(&self, operator_ca: Option<&Path>) -> anyhow::Result<String> {
        let mut pem = String::new();
        for cert in roots(operator_ca)? {
            pem.push_str(&pem_of(&cert));
        }
        pem.push_str(&self.ca_pem);
        Ok(pem)
    }

    /// Whether a tunnel to `host:port` is ended here (an index with
    /// credentials is there).
    pub(crate) fn covers(&self, host: &Host, port: u16) -> bool {
        on_host(&self.credentials, host, port)
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
    pub(crate) async fn serve<'r, S>(
        &self,
        client: S,
        upstream: TcpStream,
        reconnect: Connect<'r>,
        host: &Host,
        port: u16,
        rules: &EgressConfig,
    ) -> anyhow::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.leaf(host)?);
        let client = timeout(
            rules.head_timeout,
            acceptor.accept(Idle::new(client, rules.idle_timeout)),
        )
        .await
        .context("the installer's TLS handshake timed out")?
        .context("the installer's TLS handshake failed")?;
        let first = self.origin(upstream, host, rules).await?;
        let authority = if port == 443 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        let forward = Forward {
            interceptor: self,
            origin: tokio::sync::Mutex::new(Some(first)),
            reconnect,
            rules,
            host,
            port,
            authority: &authority,
        };
        let service = hyper::service::service_fn(|req| forward.one(req));
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(rules.head_timeout)
            .serve_connection(TokioIo::new(client), service)
            .await;
        served.map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// An HTTP/1.1 connection to the real host over verified TLS.
    async fn origin(
        &self,
        tcp: TcpStream,
        host: &Host,
        rules: &EgressConfig,
    ) -> anyhow::Result<Origin> {
        let server_name = match host {
            Host::Name(n) => ServerName::try_from(n.clone())?,
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let connector = tokio_rustls::TlsConnector::from(self.upstream_tls.clone());
        let tls = timeout(
            rules.connect_timeout,
            connector.connect(server_name, Idle::new(tcp, rules.idle_timeout)),
        )
        .await
        .with_context(|| format!("the TLS handshake with {host} timed out"))?
        .with_context(|| format!("the TLS handshake with {host} failed"))?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tls)).await?;
        Ok(Origin {
            sender,
            _connection: AbortOnDrop(tokio::spawn(connection)),
        })
    }
}

/// One connection to the real host: requests go out on `sender` while its
/// task runs the connection.
struct Origin {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    _connection: AbortOnDrop<Result<(), hyper::Error>>,
}

/// The roots the real indexes are checked against, as pip checks them: the
/// operator's bundle when there is one (its certificates only), else the
/// system's.
fn roots(operator_ca: Option<&Path>) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    match operator_ca {
        Some(path) => Ok(CertificateDer::pem_file_iter(path)
            .with_context(|| format!("cannot read the CA bundle {}", path.display()))?
            .flatten()
            .collect()),
        None => Ok(rustls_native_certs::load_native_certs().certs),
    }
}

/// The TLS settings of connections to the real indexes.
fn upstream_tls(operator_ca: Option<&Path>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut store = rustls::RootCertStore::empty();
    for cert in roots(operator_ca)? {
        let _ = store.add(cert);
    }
    let roots = store;
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

/// The request headers sent on with the credentials: what installers need
/// to fetch pages and files, nothing else (an allow-list).
const FORWARDED: &[&str] = &[
    "accept",
    "accept-encoding",
    "accept-language",
    "user-agent",
    "range",
    "if-range",
    "if-none-match",
    "if-modified-since",
    "cache-control",
    "pragma",
];

/// Response headers that describe one hop, or hand out a login (a session
/// cookie would be the credentials by another name).
const NOT_RETURNED: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authenticate",
    "set-cookie",
    "set-cookie2",
    "authentication-info",
];

struct Forward<'a, 'r> {
    interceptor: &'a Interceptor,
    origin: tokio::sync::Mutex<Option<Origin>>,
    reconnect: Connect<'r>,
    rules: &'a EgressConfig,
    host: &'a Host,
    port: u16,
    authority: &'a str,
}

impl Forward<'_, '_> {
    async fn one(&self, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        Ok(self
            .send(req)
            .await
            .unwrap_or_else(|(status, why)| answer(status, why)))
    }

    async fn send(&self, req: Request<Incoming>) -> Result<Response<Body>, (StatusCode, String)> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            crate::metrics::egress_refusal(
                crate::metrics::EgressAudience::Installers,
                crate::metrics::EgressRefusal::Method,
            );
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
        if !plain_path(req.uri().path()) {
            return Err((
                StatusCode::BAD_REQUEST,
                "ferrepl: a path with dot segments or encoded separators is not sent with the operator's credentials".to_string(),
            ));
        }
        // Outside every index's root the request goes without them.
        let credential = choose(
            &self.interceptor.credentials,
            self.host,
            self.port,
            req.uri().path(),
        );
        let mut out = Request::builder().method(req.method()).uri(&path);
        for (name, value) in req.headers() {
            if FORWARDED.contains(&name.as_str()) {
                out = out.header(name, value);
            }
        }
        out = out.header(header::HOST, self.authority);
        if let Some(c) = credential {
            out = out.header(header::AUTHORIZATION, c.authorization());
        }
        let out = out
            .body(Empty::new())
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("ferrepl: {e}")))?;
        let wait = self.rules.idle_timeout;
        let response = match timeout(wait, self.send_on(out, true)).await {
            Err(_) => {
                return Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("ferrepl: {} did not answer within {wait:?}", self.host),
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
        let closing = parts
            .headers
            .get(header::CONNECTION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"));
        for name in NOT_RETURNED {
            parts.headers.remove(*name);
        }
        if closing {
            // The installer opens a new tunnel for its next request.
            parts.headers.insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        Ok(Response::from_parts(parts, body.boxed()))
    }

    /// Sends `req` on the connection to the real host, connecting again
    /// when the host closed the last one (keep-alive ends).
    /// A GET or HEAD on a kept connection that the host closed just as it
    /// went out (before its answer) is sent again, once, on a new one:
    /// both are safe to repeat.
    async fn send_on(
        &self,
        req: Request<Empty<Bytes>>,
        may_retry: bool,
    ) -> anyhow::Result<Response<Incoming>> {
        let mut origin = self.origin.lock().await;
        let usable = match origin.as_mut() {
            Some(o) => !o.sender.is_closed() && o.sender.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            *origin = None;
            let tcp = (self.reconnect)().await.map_err(|e| anyhow::anyhow!(e))?;
            *origin = Some(self.interceptor.origin(tcp, self.host, self.rules).await?);
        }
        let Some(o) = origin.as_mut() else {
            anyhow::bail!("no connection");
        };
        o.sender.ready().await?;
        let again = (may_retry && usable).then(|| copy_request(&req));
        match o.sender.send_request(req).await {
            Ok(r) => Ok(r),
            Err(e) => match again {
                Some(copy) if e.is_canceled() || e.is_closed() || e.is_incomplete_message() => {
                    *origin = None;
                    drop(origin);
                    Box::pin(self.send_on(copy, false)).await
                }
                _ => Err(e.into()),
            },
        }
    }
}

/// The same bodiless request again.
fn copy_request(req: &Request<Empty<Bytes>>) -> Request<Empty<Bytes>> {
    let mut copy = Request::new(Empty::new());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.headers_mut() = req.headers().clone();
    copy
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
mod tests;
