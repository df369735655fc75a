//! Prometheus metrics: one process-wide registry, recorded from anywhere
//! (tool dispatch, cells, worker launches, limits, refusals, egress, jobs)
//! and rendered on demand in the OpenMetrics text format, with the gauges
//! only the caller can count (sessions and jobs per tenant) added at
//! scrape time.
//!
//! Recording is an atomic add (plus, for a labelled family, a hash and a
//! read lock); the tool-call path, which is benchmarked, uses per-tool
//! handles created once so it does not even hash. Every label value is a
//! `&'static str` from a fixed set (the enums below, and tool names the
//! server maps to its own table or "unknown"), so the number of series is
//! bounded whatever agents send. A leaf: it names its own label types and
//! imports nothing of the crate.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

mod labels;

pub use labels::{
    CellOutcome, EgressAudience, EgressRefusal, JobKind, LanguageLabel, Limit, SandboxRefusal,
    ToolOutcome,
};
use labels::{EGRESS_REFUSALS, FINAL_STATUSES, SANDBOX_REFUSALS};

/// The Content-Type of what [`render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Tool call durations: from a fast inspect (~0.25 ms of overhead) to a
/// wait at its longest window.
const CALL_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The tool label of a name missing from the tool table: a client may send
/// any name, and each must not become a series of its own.
pub const UNKNOWN_TOOL: &str = "unknown";

type Label = [(&'static str, &'static str); 1];
type Labels = [(&'static str, &'static str); 2];
type HistogramFamily = Family<Label, Histogram, fn() -> Histogram>;

/// One tool's series, created on its first call.
struct ToolSeries {
    outcomes: [Counter; 3],
    seconds: Histogram,
}

struct Metrics {
    registry: Registry,
    tool_calls: Family<Labels, Counter>,
    tool_seconds: HistogramFamily,
    /// Each tool's series, made on its first call.
    tools: RwLock<Vec<(&'static str, Arc<ToolSeries>)>>,
    cells: Family<Labels, Counter>,
    worker_starts: Family<Labels, Counter>,
    oom_kills: Counter,
    limit_kills: Family<Label, Counter>,
    sandbox_refusals: Family<Label, Counter>,
    egress_refusals: Family<Labels, Counter>,
    admission_refusals: Family<Label, Counter>,
    jobs_started: Family<Label, Counter>,
    http_refusals: Family<Label, Counter>,
    http_share_refusals: Family<Labels, Counter>,
    limits: Family<Label, Gauge>,
}

fn call_histogram() -> Histogram {
    Histogram::new(CALL_BUCKETS)
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Registers `metric` under `name` and hands it back.
fn register<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Creates the series `key=value` of a one-label family for each value, so
/// it is exported (as zero) before anything is counted.
fn preset(family: &Family<Label, Counter>, key: &'static str, values: &[&'static str]) {
    for value in values {
        family.get_or_create_owned(&[(key, *value)]);
    }
}

impl Metrics {
    fn new() -> Self {
        let mut r = Registry::with_prefix("ferrepl");
        let tool_calls = register(
            &mut r,
            "tool_calls",
            "Tool calls by tool and outcome (ok, error: an isError result, protocol_error: a JSON-RPC error)",
            Family::<Labels, Counter>::default(),
        );
        let tool_seconds: HistogramFamily = Family::new_with_constructor(call_histogram);
        r.register_with_unit(
            "tool_call",
            "Time from a tool call's dispatch to its result",
            Unit::Seconds,
            tool_seconds.clone(),
        );
        let cells = register(
            &mut r,
            "cells",
            "Cells finished, by language and final status (re-runs of a rebuild not counted)",
            Family::<Labels, Counter>::default(),
        );
        let worker_starts = register(
            &mut r,
            "worker_starts",
            "Interpreter launches (sessions and the warm pool) by language and outcome (started: ready; failed)",
            Family::<Labels, Counter>::default(),
        );
        let oom_kills = register(
            &mut r,
            "oom_kills",
            "Processes the kernel's memory cgroup killed in sessions and jobs",
            Counter::default(),
        );
        let egress_refusals = register(
            &mut r,
            "egress_refusals",
            "Connections an egress proxy refused, by proxy (installers: package installs; cells: --network domains) and reason",
            Family::<Labels, Counter>::default(),
        );
        let mut family = |name: &str, help: &str| register(&mut r, name, help, Family::default());
        let limit_kills = family(
            "limit_kills",
            "Sessions or cells ferrepl stopped for going over a limit (memory, processes, cell_time)",
        );
        let sandbox_refusals = family(
            "sandbox_refusals",
            "Requests refused on policy grounds (paths outside the workspace, interpreters, environment variables)",
        );
        let admission_refusals = family(
            "admission_refusals",
            "New sessions, cells or jobs refused (draining, instance_full: --max-sessions, jobs_full: --max-jobs, tenant_sessions_full and tenant_jobs_full: a tenant's share, disk_full: --tenant-disk, revoked: the tenant's tokens removed)",
        );
        let jobs_started = family("jobs_started", "Jobs started (shell, install)");
        let http_refusals = family(
            "http_refusals",
            "HTTP connections refused, or closed for a slow or silent peer (max_connections, per_peer, header_timeout, idle_timeout, body_timeout, write_timeout: a response it stopped reading)",
        );
        let http_share_refusals = register(
            &mut r,
            "http_share_refusals",
            "HTTP requests refused because their principal (principal: tenant, or peer for a client address without a token) held its share (share: connections, streams, buffered_bytes) or the instance held all its buffered bytes (buffered_bytes_total)",
            Family::<Labels, Counter>::default(),
        );
        let limits = register(
            &mut r,
            "limit",
            "Limits this server enforces, named as their flags (tenant_*: each tenant's share; *_seconds: timeouts; 0: off)",
            Family::<Label, Gauge>::default(),
        );
        let tools = RwLock::new(Vec::new());
        let metrics = Metrics {
            registry: r,
            tool_calls,
            tool_seconds,
            tools,
            cells,
            worker_starts,
            oom_kills,
            limit_kills,
            sandbox_refusals,
            egress_refusals,
            admission_refusals,
            jobs_started,
            http_refusals,
            http_share_refusals,
            limits,
        };
        metrics.preset_zeros();
        metrics
    }

    /// The small fixed families start at zero, so each series exists (and
    /// rates work) from the first scrape; the per-tool series, two dozen
    /// tools with a histogram each, appear on first use.
    fn preset_zeros(&self) {
        for language in LanguageLabel::ALL {
            for status in FINAL_STATUSES {
                self.cells.get_or_create_owned(&[
                    ("language", language.as_str()),
                    ("status", status.as_str()),
                ]);
            }
            for outcome in ["started", "failed"] {
                self.worker_starts
                    .get_or_create_owned(&[("language", language.as_str()), ("outcome", outcome)]);
            }
        }
        preset(
            &self.limit_kills,
            "limit",
            &[Limit::Memory, Limit::Processes, Limit::CellTime].map(Limit::as_str),
        );
        preset(
            &self.sandbox_refusals,
            "kind",
            &SANDBOX_REFUSALS.map(SandboxRefusal::as_str),
        );
        for audience in EgressAudience::ALL {
            for reason in EGRESS_REFUSALS {
                self.egress_refusals.get_or_create_owned(&[
                    ("proxy", audience.as_str()),
                    ("reason", reason.as_str()),
                ]);
            }
        }
        preset(
            &self.admission_refusals,
            "reason",
            &[
                "draining",
                "instance_full",
                "jobs_full",
                "tenant_jobs_full",
                "tenant_sessions_full",
                "disk_full",
            ],
        );
        preset(
            &self.http_refusals,
            "reason",
            &[
                "max_connections",
                "per_peer",
                "header_timeout",
                "idle_timeout",
                "body_timeout",
                "write_timeout",
            ],
        );
        preset(
            &self.jobs_started,
            "kind",
            &[JobKind::Shell, JobKind::Install].map(JobKind::as_str),
        );
    }

    /// The series of `label` (one of the server's tool names, or
    /// "unknown": the caller bounds the set).
    fn tool(&self, label: &'static str) -> Arc<ToolSeries> {
        let known = |tools: &[(&'static str, Arc<ToolSeries>)]| {
            tools
                .iter()
                .find(|(name, _)| *name == label)
                .map(|(_, series)| series.clone())
        };
        if let Some(series) = known(&self.tools.read().unwrap_or_else(|e| e.into_inner())) {
            return series;
        }
        let mut tools = self.tools.write().unwrap_or_else(|e| e.into_inner());
        if let Some(series) = known(&tools) {
            return series;
        }
        let counter = |outcome: ToolOutcome| {
            self.tool_calls
                .get_or_create_owned(&[("tool", label), ("outcome", outcome.as_str())])
        };
        let series = Arc::new(ToolSeries {
            outcomes: [
                counter(ToolOutcome::Ok),
                counter(ToolOutcome::Error),
                counter(ToolOutcome::ProtocolError),
            ],
            seconds: self.tool_seconds.get_or_create_owned(&[("tool", label)]),
        });
        tools.push((label, series.clone()));
        series
    }
}

/// The label a tool name is counted under: its own when `known` holds it
/// (the server's tools), "unknown" otherwise.
pub fn tool_label(name: &str, mut known: impl Iterator<Item = &'static str>) -> &'static str {
    known.find(|k| *k == name).unwrap_or(UNKNOWN_TOOL)
}

/// A finished tool call.
pub fn tool_call(tool: &'static str, outcome: ToolOutcome, took: Duration) {
    let series = metrics().tool(tool);
    let index = match outcome {
        ToolOutcome::Ok => 0,
        ToolOutcome::Error => 1,
        ToolOutcome::ProtocolError => 2,
    };
    series.outcomes[index].inc();
    series.seconds.observe(took.as_secs_f64());
}

/// A cell that reached its final status.
pub fn cell_finished(language: LanguageLabel, status: CellOutcome) {
    metrics()
        .cells
        .get_or_create(&[("language", language.as_str()), ("status", status.as_str())])
        .inc();
}

/// An interpreter launch: ready (`started`) or not.
pub fn worker_start(language: LanguageLabel, started: bool) {
    let outcome = if started { "started" } else { "failed" };
    metrics()
        .worker_starts
        .get_or_create(&[("language", language.as_str()), ("outcome", outcome)])
        .inc();
}

/// Processes the kernel's OOM killer ended in one cgroup.
pub fn oom_kills(count: u64) {
    if count > 0 {
        metrics().oom_kills.inc_by(count);
    }
}

/// ferrepl stopped a session or cell for going over `limit`.
pub fn limit_kill(limit: Limit) {
    metrics()
        .limit_kills
        .get_or_create(&[("limit", limit.as_str())])
        .inc();
}

/// The server refused a request on policy grounds.
pub fn sandbox_refusal(kind: SandboxRefusal) {
    metrics()
        .sandbox_refusals
        .get_or_create(&[("kind", kind.as_str())])
        .inc();
}

/// An egress proxy refused a connection. Never labelled by host: the
/// agent chooses hosts, and each would become a series of its own.
pub fn egress_refusal(audience: EgressAudience, reason: EgressRefusal) {
    metrics()
        .egress_refusals
        .get_or_create(&[("proxy", audience.as_str()), ("reason", reason.as_str())])
        .inc();
}

/// New work was refused at the gate (`reason`: draining, instance_full,
/// jobs_full, disk_full).
pub fn admission_refusal(reason: &'static str) {
    metrics()
        .admission_refusals
        .get_or_create(&[("reason", reason)])
        .inc();
}

/// An HTTP connection refused or closed by the listener's bounds.
pub fn http_refusal(reason: &'static str) {
    metrics()
        .http_refusals
        .get_or_create(&[("reason", reason)])
        .inc();
}

/// An HTTP request refused for its principal's share (or the instance's
/// total of buffered bytes).
pub fn http_share_refusal(share: &'static str, principal: &'static str) {
    metrics()
        .http_share_refusals
        .get_or_create(&[("share", share), ("principal", principal)])
        .inc();
}

/// A job was started.
pub fn job_started(kind: JobKind) {
    metrics()
        .jobs_started
        .get_or_create(&[("kind", kind.as_str())])
        .inc();
}

/// The limits in force, set once at start (`ferrepl_limit{limit}`).
pub fn set_limits(limits: &[(&'static str, u64)]) {
    for (name, value) in limits {
        metrics()
            .limits
            .get_or_create(&[("limit", *name)])
            .set(gauge_value(*value));
    }
}

/// What the caller counts for one tenant at scrape time (a tenant is
/// whatever shares a session manager: the stdio server, or one principal
/// over HTTP).
#[derive(Debug, Clone, Default)]
pub struct TenantCounts {
    pub tenant: String,
    pub sessions_by_state: Vec<(&'static str, u64)>,
    pub jobs_by_state: Vec<(&'static str, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TenantState {
    tenant: String,
    state: &'static str,
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The whole exposition: every recorded metric, then `ferrepl_sessions`,
/// `ferrepl_jobs`, `ferrepl_draining` and `ferrepl_up`, ending with
/// `# EOF`. Serve it with [`CONTENT_TYPE`].
pub fn render(tenants: &[TenantCounts], draining: bool) -> String {
    let mut scrape = Registry::with_prefix("ferrepl");
    let sessions = Family::<TenantState, Gauge>::default();
    let jobs = Family::<TenantState, Gauge>::default();
    for t in tenants {
        for (family, counts) in [(&sessions, &t.sessions_by_state), (&jobs, &t.jobs_by_state)] {
            for (state, n) in counts {
                let labels = TenantState {
                    tenant: t.tenant.clone(),
                    state,
                };
                family.get_or_create(&labels).set(gauge_value(*n));
            }
        }
    }
    scrape.register("sessions", "Sessions by tenant and state", sessions);
    scrape.register("jobs", "Jobs by tenant and state", jobs);
    let flag = |on: bool| {
        let g = Gauge::<i64>::default();
        g.set(i64::from(on));
        g
    };
    scrape.register(
        "draining",
        "1 while the server is draining (finishing work, taking no new sessions)",
        flag(draining),
    );
    scrape.register("up", "1: the server answers", flag(true));

    let mut out = String::with_capacity(8192);
    // Writing into a String cannot fail; an encoder error would only cut
    // the text short, and the EOF marker below still closes it.
    let _ = text::encode_registry(&mut out, &metrics().registry);
    let _ = text::encode_registry(&mut out, &scrape);
    let _ = text::encode_eof(&mut out);
    out
}

#[cfg(test)]
mod tests;
