use super::{listen_addr, log_directives};

#[test]
fn the_mcp_library_is_quiet_unless_named_or_debugging() {
    assert_eq!(log_directives("info"), "info,rmcp=error");
    assert_eq!(
        log_directives("warn,ferrepl=debug"),
        "warn,ferrepl=debug,rmcp=error"
    );
    assert_eq!(log_directives("info,rmcp=info"), "info,rmcp=info");
    assert_eq!(log_directives("debug"), "debug");
    for directives in ["info", "warn,ferrepl=debug", "error", "ferrepl=trace"] {
        let filter = log_directives(directives);
        assert!(
            tracing_subscriber::EnvFilter::try_new(&filter).is_ok(),
            "{filter}"
        );
    }
}

#[test]
fn a_port_alone_is_localhost() {
    assert_eq!(
        listen_addr("8000").map(|a| a.to_string()),
        Ok("127.0.0.1:8000".into())
    );
    assert_eq!(
        listen_addr("0.0.0.0:9").map(|a| a.to_string()),
        Ok("0.0.0.0:9".into())
    );
    let e = listen_addr("localhost:x").expect_err("refused");
    assert!(e.contains("HOST:PORT") && e.contains("a port alone"), "{e}");
}
