//! The request: its head read within the limits, and what to do with it
//! (a tunnel, or a plain HTTP request rewritten for the upstream).

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::timeout_at;

use super::deadline_after;
use super::refusal::Refusal;
use crate::egress::{EgressConfig, Host, normalize_host};

/// Header lines accepted in a request head (more is answered 431).
const MAX_HEADERS: usize = 100;

/// Headers that concern one hop only: never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "host",
    "connection",
    "proxy-connection",
    "proxy-authorization",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

/// The parts of a request head the proxy uses, owned.
pub(super) struct Head {
    /// Bytes of the head in the buffer (what follows belongs to the body or tunnel).
    pub(super) len: usize,
    pub(super) method: String,
    target: String,
    /// Minor HTTP version: 0 or 1.
    version: u8,
    headers: Vec<(String, Vec<u8>)>,
}

/// Reads the request head within `head_timeout` and `max_head_bytes`.
/// Returns the bytes read (head and whatever followed it) and the parsed
/// head, or None when the client closed before completing a head.
pub(super) async fn read_head<S>(
    client: &mut S,
    rules: &EgressConfig,
) -> Result<Option<(Vec<u8>, Head)>, Refusal>
where
    S: AsyncRead + Unpin,
{
    let deadline = deadline_after(rules.head_timeout);
    let mut buf: Vec<u8> = Vec::with_capacity(rules.max_head_bytes.min(8192));
    let mut chunk = [0u8; 4096];
    loop {
        if !buf.is_empty()
            && let Some(head) = parse_head(&buf)?
        {
            return Ok(Some((buf, head)));
        }
        let room = rules.max_head_bytes.saturating_sub(buf.len());
        if room == 0 {
            return Err(Refusal::new(
                431,
                format!(
                    "ferrepl: the request head exceeds {} bytes",
                    rules.max_head_bytes
                ),
            ));
        }
        let want = room.min(chunk.len());
        match timeout_at(deadline, client.read(&mut chunk[..want])).await {
            Err(_) => {
                return Err(Refusal::new(
                    408,
                    format!(
                        "ferrepl: the request head did not arrive within {} ms",
                        rules.head_timeout.as_millis()
                    ),
                ));
            }
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The head at the start of `buf`: complete, not yet (None), or refused.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(Head {
            len,
            method: req.method.unwrap_or_default().to_string(),
            target: req.path.unwrap_or_default().to_string(),
            version: req.version.unwrap_or(1),
            headers: req
                .headers
                .iter()
                .map(|h| (h.name.to_string(), h.value.to_vec()))
                .collect(),
        })),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(Refusal::new(
            431,
            format!("ferrepl: the request head has more than {MAX_HEADERS} header lines"),
        )),
        Err(e) => Err(Refusal::bad_request(e)),
    }
}

pub(super) enum Plan {
    Connect {
        host: Host,
        port: u16,
    },
    Http {
        host: Host,
        port: u16,
        /// The head to send upstream (origin-form, cleaned headers).
        head: Vec<u8>,
        /// Request body bytes to forward (Content-Length).
        body_len: u64,
    },
}

/// Turns a parsed head into what to do, or a 400/501.
pub(super) fn plan(head: &Head) -> Result<Plan, Refusal> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = parse_authority(&head.target).ok_or_else(|| {
            Refusal::bad_request(format!(
                "CONNECT needs a host:port target, got {:?}",
                shown(&head.target)
            ))
        })?;
        return Ok(Plan::Connect { host, port });
    }
    let (host, port, path) = absolute_url(&head.target)?;
    let framing = Framing::of(&head.headers)?;
    let out = origin_head(head, &host, port, &path, &framing.connection_tokens);
    Ok(Plan::Http {
        host,
        port,
        head: out,
        body_len: framing.body_len.unwrap_or(0),
    })
}

/// Host, port and origin-form path of an absolute `http://` target.
fn absolute_url(target: &str) -> Result<(Host, u16, String), Refusal> {
    let scheme_end = target.find("://");
    let scheme = scheme_end.map(|i| &target[..i]);
    match scheme {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => {
            return Err(Refusal::bad_request(
                "https:// URLs must go through CONNECT, not plain forwarding",
            ));
        }
        _ => {
            return Err(Refusal::bad_request(format!(
                "this is a forward proxy: use CONNECT host:port or an absolute http:// URL, got {:?}",
                shown(target)
            )));
        }
    }
    let uri: http::Uri = target
        .parse()
        .map_err(|e| Refusal::bad_request(format!("bad URL {:?}: {e}", shown(target))))?;
    let authority = uri
        .authority()
        .ok_or_else(|| Refusal::bad_request(format!("no host in {:?}", shown(target))))?;
    if authority.as_str().contains('@') {
        return Err(Refusal::bad_request(
            "credentials in the URL are not forwarded",
        ));
    }
    let host = normalize_host(authority.host())
        .ok_or_else(|| Refusal::bad_request(format!("bad host in {:?}", shown(target))))?;
    let port = match authority.port() {
        None => 80,
        Some(p) => match p.as_u16() {
            0 => {
                return Err(Refusal::bad_request(format!(
                    "bad port in {:?}",
                    shown(target)
                )));
            }
            p => p,
        },
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let path = if path.is_empty() { "/" } else { path };
    Ok((host, port, path.to_string()))
}

/// How a plain HTTP request's body is framed, and the headers its
/// Connection headers name (lowercase).
struct Framing {
    body_len: Option<u64>,
    connection_tokens: Vec<String>,
}

impl Framing {
    /// Content-Length framing only: a chunked body would need parsing to
    /// know where this request ends, and nothing may follow it.
    fn of(headers: &[(String, Vec<u8>)]) -> Result<Self, Refusal> {
        let mut body_len: Option<u64> = None;
        let mut connection_tokens: Vec<String> = Vec::new();
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(Refusal::new(
                    501,
                    "ferrepl: request bodies with Transfer-Encoding are not supported by the egress proxy"
                        .to_string(),
                ));
            }
            if name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(value)
                    .ok()
                    .map(str::trim)
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| Refusal::bad_request("bad Content-Length"))?;
                if body_len.is_some_and(|b| b != v) {
                    return Err(Refusal::bad_request("conflicting Content-Length headers"));
                }
                body_len = Some(v);
            }
            if (name.eq_ignore_ascii_case("connection")
                || name.eq_ignore_ascii_case("proxy-connection"))
                && let Ok(v) = std::str::from_utf8(value)
            {
                connection_tokens.extend(
                    v.split(',')
                        .map(|t| t.trim().to_ascii_lowercase())
                        .filter(|t| !t.is_empty()),
                );
            }
        }
        Ok(Framing {
            body_len,
            connection_tokens,
        })
    }
}

/// The head sent upstream: origin-form, Host from the URL, hop-by-hop
/// headers dropped, `Connection: close`.
fn origin_head(
    head: &Head,
    host: &Host,
    port: u16,
    path: &str,
    connection_tokens: &[String],
) -> Vec<u8> {
    let dropped = |name: &str| {
        let lower = name.to_ascii_lowercase();
        HOP_BY_HOP.contains(&lower.as_str())
            // Headers named by Connection are hop-by-hop too, except the
            // ones that frame the request: dropping those would let the
            // body be read upstream as another request.
            || (lower != "content-length" && connection_tokens.contains(&lower))
    };

    let mut out = Vec::with_capacity(head.len + 64);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(format!(" HTTP/1.{}\r\n", head.version.min(1)).as_bytes());
    // Host comes from the URL, whatever the client's Host header says: the
    // allow-list check applies to the name the upstream sees.
    if port == 80 {
        out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
    } else {
        out.extend_from_slice(format!("Host: {host}:{port}\r\n").as_bytes());
    }
    for (name, value) in &head.headers {
        if dropped(name) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// A request target cut to a length fit for a one-line message.
fn shown(target: &str) -> &str {
    const MAX: usize = 120;
    if target.len() <= MAX {
        return target;
    }
    let mut end = MAX;
    while !target.is_char_boundary(end) {
        end -= 1;
    }
    &target[..end]
}

/// `host:port` or `[v6]:port`, as in a CONNECT target.
fn parse_authority(target: &str) -> Option<(Host, u16)> {
    let (host, port) = if target.starts_with('[') {
        let close = target.find(']')?;
        let port = target[close + 1..].strip_prefix(':')?;
        (&target[..=close], port)
    } else {
        let (host, port) = target.rsplit_once(':')?;
        if host.contains(':') {
            return None;
        }
        (host, port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    Some((normalize_host(host)?, port))
}
