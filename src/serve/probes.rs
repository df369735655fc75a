//! Health, readiness and metrics over HTTP, and the Host/Origin rules the
//! main listener applies to them (rmcp applies its own to /mcp).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};

use super::http::{HttpState, text};
use crate::config::settings::Settings;
use crate::tenants::Tenant;

/// The Host names and browser Origins the main listener accepts.
pub struct OriginRules {
    pub(super) hosts: Vec<String>,
    pub(super) origins: Vec<String>,
}

impl OriginRules {
    pub fn new(settings: &Settings) -> Self {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"]
            .map(String::from)
            .to_vec();
        hosts.extend(settings.serving.allow_hosts.iter().cloned());
        let mut origins: Vec<String> =
            ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
                .map(String::from)
                .to_vec();
        origins.extend(settings.serving.allow_origins.iter().cloned());
        Self { hosts, origins }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let (name, port) = split_port(host);
        self.hosts.iter().any(|allowed| {
            let (a_name, a_port) = split_port(allowed);
            a_name.eq_ignore_ascii_case(name) && (a_port.is_none() || a_port == port)
        })
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let (base, port) = split_port(origin);
        self.origins.iter().any(|allowed| {
            let (a_base, a_port) = split_port(allowed);
            a_base.eq_ignore_ascii_case(base) && (a_port == Some("*") || a_port == port)
        })
    }
}

/// "name:port" into its parts; a bracketed IPv6 address keeps its colons.
fn split_port(s: &str) -> (&str, Option<&str>) {
    match s.rfind(':') {
        Some(i) if !s[i + 1..].contains(']') && !s[i + 1..].contains('/') => {
            let name = &s[..i];
            // "::1" alone is an address, not a name and a port.
            if name.contains(':') && !name.contains('[') && !name.contains("//") {
                (s, None)
            } else {
                (name, Some(&s[i + 1..]))
            }
        }
        _ => (s, None),
    }
}

/// Host and Origin checks for everything but the MCP endpoints.
pub(super) async fn check_host_and_origin(
    State(state): State<Arc<HttpState>>,
    req: Request,
    next: Next,
) -> Response {
    if req.uri().path().ends_with("/mcp") {
        return next.run(req).await;
    }
    if let Some(refusal) = refuse_host_or_origin(&state.origin_rules, req.headers()) {
        return text(StatusCode::FORBIDDEN, refusal);
    }
    next.run(req).await
}

/// Why a request's Host or Origin is refused (the viewer has rules of its
/// own, `viewer::hosts`).
pub fn refuse_host_or_origin(
    rules: &OriginRules,
    headers: &axum::http::HeaderMap,
) -> Option<&'static str> {
    let value = |name: header::HeaderName| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string())
    };
    if value(header::HOST).is_some_and(|h| !rules.host_allowed(&h)) {
        return Some(
            "Host not allowed (--allow-host); probes and Prometheus can use --metrics-addr\n",
        );
    }
    if value(header::ORIGIN).is_some_and(|o| !rules.origin_allowed(&o)) {
        return Some("Origin not allowed (--allow-origin)\n");
    }
    None
}

/// The process serves requests.
pub(super) async fn healthz() -> Response {
    text(StatusCode::OK, "ok\n")
}

/// It can take new sessions: not draining, and its interpreter is there.
pub(super) async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    match state.instance.is_ready() {
        Ok(()) => text(StatusCode::OK, "ready\n"),
        Err(why) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("not ready: {why}\n"),
        ),
    }
}

/// `/metrics` on the main listener: a named tenant's token does not read
/// them, as they name every tenant of the instance and count its work.
pub(super) async fn metrics_of_caller(
    State(state): State<Arc<HttpState>>,
    Extension(tenant): Extension<Tenant>,
) -> Response {
    if let Tenant::Named(_) = tenant {
        return text(
            StatusCode::FORBIDDEN,
            "the metrics of an instance with tenants are served on --metrics-addr only (they name every tenant)\n",
        );
    }
    metrics(State(state)).await
}

pub(super) async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let instance = &state.instance;
    let counts: Vec<crate::metrics::TenantCounts> = instance
        .live()
        .iter()
        .map(|t| crate::metrics::TenantCounts {
            tenant: t.tenant.name().to_string(),
            sessions_by_state: t.manager.state_counts(),
            jobs_by_state: t.jobs.state_counts(),
        })
        .collect();
    let body = crate::metrics::render(&counts, instance.is_draining());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        body,
    )
        .into_response()
}

/// The same three, for --metrics-addr: no token, any Host.
pub(super) fn open_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> OriginRules {
        OriginRules {
            hosts: vec![
                "localhost".into(),
                "::1".into(),
                "[::1]".into(),
                "pod-0:8000".into(),
            ],
            origins: vec![
                "http://localhost:*".into(),
                "https://app.example:443".into(),
            ],
        }
    }

    #[test]
    fn hosts_match_by_name_and_port_when_given() {
        let r = rules();
        assert!(r.host_allowed("localhost:8000"));
        assert!(r.host_allowed("LOCALHOST"));
        assert!(r.host_allowed("[::1]:8000"));
        assert!(r.host_allowed("pod-0:8000"));
        assert!(!r.host_allowed("pod-0:9000"));
        assert!(!r.host_allowed("evil.example"));
        assert!(!r.host_allowed("localhost.evil.example:8000"));
    }

    #[test]
    fn origins_match_with_wildcard_ports() {
        let r = rules();
        assert!(r.origin_allowed("http://localhost:3000"));
        assert!(r.origin_allowed("https://app.example:443"));
        assert!(!r.origin_allowed("https://app.example:8443"));
        assert!(!r.origin_allowed("http://evil.example:3000"));
        assert!(!r.origin_allowed("null"));
    }
}
