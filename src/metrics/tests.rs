//! What the exposition holds and how recording moves it.

use super::*;

/// The value of the sample whose line starts with `prefix` (name and
/// labels), or 0 when there is none yet.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn render_has_every_family_and_ends_with_eof() {
    let tenants = [TenantCounts {
        tenant: "alice".into(),
        sessions_by_state: vec![("idle", 2), ("busy", 1)],
        jobs_by_state: vec![("running", 3)],
    }];
    // Per-tool series appear with a tool's first call.
    tool_call("file_list", ToolOutcome::Ok, Duration::ZERO);
    let text = render(&tenants, true);
    for family in [
        "ferrepl_tool_calls",
        "ferrepl_tool_call_seconds",
        "ferrepl_cells",
        "ferrepl_worker_starts",
        "ferrepl_oom_kills",
        "ferrepl_limit_kills",
        "ferrepl_sandbox_refusals",
        "ferrepl_egress_refusals",
        "ferrepl_jobs_started",
        "ferrepl_sessions",
        "ferrepl_jobs",
        "ferrepl_draining",
        "ferrepl_up",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} missing:\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"));
    assert_eq!(text.matches("# EOF").count(), 1);
    assert_eq!(
        sample(&text, r#"ferrepl_sessions{tenant="alice",state="idle"}"#),
        2.0
    );
    assert_eq!(
        sample(&text, r#"ferrepl_jobs{tenant="alice",state="running"}"#),
        3.0
    );
    assert_eq!(sample(&text, "ferrepl_draining"), 1.0);
    assert_eq!(sample(&text, "ferrepl_up"), 1.0);
    // Zero from the start, before anything is recorded.
    assert!(text.contains(r#"ferrepl_limit_kills_total{limit="cell_time"} "#));
    assert_eq!(sample(&render(&[], false), "ferrepl_draining"), 0.0);
    // A tenant is the caller's string: quoted, never breaking a line.
    let odd = [TenantCounts {
        tenant: "a\"b\nc".into(),
        sessions_by_state: vec![("idle", 1)],
        jobs_by_state: Vec::new(),
    }];
    let text = render(&odd, false);
    assert!(
        text.contains(r#"ferrepl_sessions{tenant="a\"b\nc",state="idle"} 1"#),
        "{text}"
    );
}

#[test]
fn tool_calls_are_counted_and_timed() {
    let ok = r#"ferrepl_tool_calls_total{tool="python_inspect",outcome="ok"}"#;
    let err = r#"ferrepl_tool_calls_total{tool="python_inspect",outcome="error"}"#;
    let count = r#"ferrepl_tool_call_seconds_count{tool="python_inspect"}"#;
    let before = render(&[], false);
    tool_call(
        "python_inspect",
        ToolOutcome::Ok,
        Duration::from_micros(300),
    );
    tool_call("python_inspect", ToolOutcome::Ok, Duration::from_secs(2));
    tool_call("python_inspect", ToolOutcome::Error, Duration::ZERO);
    let after = render(&[], false);
    assert_eq!(sample(&after, ok) - sample(&before, ok), 2.0);
    assert_eq!(sample(&after, err) - sample(&before, err), 1.0);
    assert_eq!(sample(&after, count) - sample(&before, count), 3.0);
    let fast = r#"ferrepl_tool_call_seconds_bucket{le="0.0005",tool="python_inspect"}"#;
    assert!(sample(&after, fast) >= 2.0, "{after}");
}

#[test]
fn unknown_tools_share_one_label() {
    let known = || ["python_exec", "python_wait"].into_iter();
    assert_eq!(tool_label("python_exec", known()), "python_exec");
    assert_eq!(tool_label("no_such_tool", known()), UNKNOWN_TOOL);
    let unknown = r#"ferrepl_tool_calls_total{tool="unknown",outcome="protocol_error"}"#;
    let before = render(&[], false);
    for name in ["no_such_tool", "another one"] {
        tool_call(
            tool_label(name, known()),
            ToolOutcome::ProtocolError,
            Duration::ZERO,
        );
    }
    let after = render(&[], false);
    assert_eq!(sample(&after, unknown) - sample(&before, unknown), 2.0);
    assert!(!after.contains("no_such_tool") && !after.contains("another one"));
}

#[test]
fn other_counters_move() {
    // Other tests of the crate may record too: only "at least one more".
    let cases: [(&str, fn()); 8] = [
        (
            r#"ferrepl_cells_total{language="python",status="interrupted"}"#,
            || cell_finished(LanguageLabel::Python, CellOutcome::Interrupted),
        ),
        (
            r#"ferrepl_worker_starts_total{language="r",outcome="failed"}"#,
            || worker_start(LanguageLabel::R, false),
        ),
        ("ferrepl_oom_kills_total", || oom_kills(1)),
        (r#"ferrepl_limit_kills_total{limit="processes"}"#, || {
            limit_kill(Limit::Processes)
        }),
        (r#"ferrepl_sandbox_refusals_total{kind="env"}"#, || {
            sandbox_refusal(SandboxRefusal::Env)
        }),
        (
            r#"ferrepl_egress_refusals_total{proxy="installers",reason="private_address"}"#,
            || egress_refusal(EgressAudience::Installers, EgressRefusal::PrivateAddress),
        ),
        (
            r#"ferrepl_egress_refusals_total{proxy="cells",reason="host"}"#,
            || egress_refusal(EgressAudience::Cells, EgressRefusal::Host),
        ),
        (r#"ferrepl_jobs_started_total{kind="install"}"#, || {
            job_started(JobKind::Install)
        }),
    ];
    for (series, record) in cases {
        let before = sample(&render(&[], false), series);
        record();
        let after = sample(&render(&[], false), series);
        assert!(after - before >= 1.0, "{series}: {before} -> {after}");
    }
}
