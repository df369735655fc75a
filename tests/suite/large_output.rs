//! Large and awkward output: head/tail truncation of results, reading the full
//! output back with python_output (windows, lines, grep), a 10 MB line, a
//! flood that must not grow the server's memory, carriage returns, escape
//! codes and invalid UTF-8.

use crate::support::{HttpServer, StdioServer, ToolOutput, call, exec_wait_args, rss_kib};
use serde_json::{Value, json};

/// What `for i in range(n): print('line', i)` writes.
fn numbered_lines(n: usize) -> String {
    (0..n).map(|i| format!("line {i}\n")).collect()
}

const HUNDRED_K_LINES: &str = "for i in range(100000): print('line', i)";

/// python_output with `args`; panics unless it succeeded.
async fn output(server: &StdioServer, args: Value) -> ToolOutput {
    let out = server.call("python_output", args.clone()).await;
    assert!(!out.is_error, "python_output {args} failed: {out:#?}");
    out
}

fn u64_field(out: &ToolOutput, key: &str) -> u64 {
    out.structured[key]
        .as_u64()
        .unwrap_or_else(|| panic!("structured_content.{key} is not an integer in {out:#?}"))
}

/// Reads a cell's whole output through character windows of `limit`,
/// following next_offset, and checks each window's bookkeeping.
async fn read_all_windows(server: &StdioServer, cell: u64, limit: u64) -> (String, usize) {
    let mut text = String::new();
    let mut offset = 0u64;
    let mut windows = 0;
    loop {
        let w = output(
            server,
            json!({ "cell": cell, "offset": offset, "limit": limit }),
        )
        .await;
        windows += 1;
        assert_eq!(u64_field(&w, "offset"), offset, "{w:#?}");
        let chunk = w.str_field("text");
        let chars = chunk.chars().count() as u64;
        text.push_str(chunk);
        match &w.structured["next_offset"] {
            Value::Null => break,
            next => {
                assert_eq!(chars, limit, "a window before the end should be full");
                let next = next.as_u64().expect("next_offset is an integer");
                assert_eq!(next, offset + chars, "next_offset of {w:#?}");
                offset = next;
            }
        }
        assert!(windows < 1000, "next_offset never ended");
    }
    (text, windows)
}

#[tokio::test]
async fn a_long_output_is_cut_in_the_middle_with_exact_byte_counts() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec(HUNDRED_K_LINES).await;
    out.assert_ok();
    let expected = numbered_lines(100_000);

    assert_eq!(
        u64_field(&out, "output_bytes"),
        expected.len() as u64,
        "output_bytes should be the exact byte count"
    );
    let omitted = u64_field(&out, "omitted_bytes");
    assert!(
        omitted > 0 && omitted < expected.len() as u64,
        "omitted_bytes {omitted}"
    );

    let text = &out.text;
    assert!(
        text.starts_with("line 0\nline 1\nline 2\n"),
        "the text should start with the first lines:\n{}",
        &text[..text.len().min(200)]
    );
    assert!(
        text.contains("\nline 99999\n"),
        "the last line is missing from the text"
    );
    let marker = text
        .lines()
        .find(|l| l.contains("omitted"))
        .unwrap_or_else(|| panic!("no omission marker in the text"));
    assert!(
        marker.contains(&omitted.to_string()) && marker.contains("python_output"),
        "the marker should give the omitted bytes and point to python_output: {marker:?}"
    );
    // The middle is really left out.
    assert!(!text.contains("\nline 50000\n"), "the middle was not cut");
    assert!(
        text.len() < 40_000,
        "the result text is {} bytes, expected about 20 KB",
        text.len()
    );
    assert!(out.str_field("stdout").len() < 40_000);
}

#[tokio::test]
async fn python_output_reads_windows_lines_and_grep_of_a_finished_cell() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec(HUNDRED_K_LINES).await;
    out.assert_ok();
    let cell = out.cell();
    let expected = numbered_lines(100_000);

    // grep, without context: exactly the ten matching lines, numbered from 1.
    let grep = output(
        &server,
        json!({ "cell": cell, "grep": "line 5000[0-9]$", "context": 0 }),
    )
    .await;
    assert_eq!(u64_field(&grep, "matches"), 10, "{grep:#?}");
    let want: String = (50_000..50_010)
        .map(|i| format!("{}: line {i}\n", i + 1))
        .collect();
    assert_eq!(grep.str_field("text"), want);
    assert_eq!(u64_field(&grep, "total_lines"), 100_000);
    assert_eq!(u64_field(&grep, "cell"), cell);

    // grep with the default context: neighbours marked with '-'.
    let grep = output(&server, json!({ "cell": cell, "grep": "line 5000[0-9]$" })).await;
    assert_eq!(u64_field(&grep, "matches"), 10, "{grep:#?}");
    let text = grep.str_field("text");
    assert!(
        text.starts_with("50000- line 49999\n50001: line 50000\n"),
        "{text}"
    );
    assert!(
        text.ends_with("50010: line 50009\n50011- line 50010\n"),
        "{text}"
    );

    // Character windows chain through next_offset and are exact.
    let mut collected = String::new();
    let mut offset = 0u64;
    for _ in 0..5 {
        let w = output(
            &server,
            json!({ "cell": cell, "offset": offset, "limit": 777 }),
        )
        .await;
        assert_eq!(u64_field(&w, "offset"), offset);
        collected.push_str(w.str_field("text"));
        offset = u64_field(&w, "next_offset");
    }
    assert_eq!(offset, 5 * 777);
    assert_eq!(collected, expected[..5 * 777]);
    // A window from the middle.
    let start = expected.find("line 77777\n").expect("in expected");
    let w = output(
        &server,
        json!({ "cell": cell, "offset": start, "limit": 22 }),
    )
    .await;
    assert_eq!(w.str_field("text"), "line 77777\nline 77778\n");

    // Line windows count from 1.
    let lines = output(
        &server,
        json!({ "cell": cell, "lines": true, "offset": 50_001, "limit": 2 }),
    )
    .await;
    assert_eq!(lines.str_field("text"), "line 50000\nline 50001\n");
    assert_eq!(u64_field(&lines, "next_offset"), 50_003);
    assert_eq!(u64_field(&lines, "total_chars"), expected.len() as u64);

    // The last window says there is nothing more.
    let tail = output(
        &server,
        json!({ "cell": cell, "lines": true, "offset": 99_999, "limit": 10 }),
    )
    .await;
    assert_eq!(tail.str_field("text"), "line 99998\nline 99999\n");
    assert!(tail.structured["next_offset"].is_null(), "{tail:#?}");

    // Without `cell`: the latest cell.
    let latest = output(&server, json!({ "limit": 14 })).await;
    assert_eq!(u64_field(&latest, "cell"), cell);
    assert_eq!(latest.str_field("text"), "line 0\nline 1\n");
}

#[tokio::test]
async fn python_output_rejects_unknown_cells_and_bad_patterns() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec("print('hello')").await;
    out.assert_ok();
    let cell = out.cell();

    let unknown = server
        .call("python_output", json!({ "cell": cell + 100 }))
        .await;
    assert!(unknown.is_error, "unknown cell should fail: {unknown:#?}");
    assert!(
        unknown.text.contains(&(cell + 100).to_string()),
        "the message should name the cell: {:?}",
        unknown.text
    );

    let bad = server
        .call("python_output", json!({ "cell": cell, "grep": "line (" }))
        .await;
    assert!(bad.is_error, "an invalid regex should fail: {bad:#?}");
    assert!(
        bad.text.to_lowercase().contains("pattern") || bad.text.to_lowercase().contains("regex"),
        "the message should say the pattern is invalid: {:?}",
        bad.text
    );

    // The session is fine afterwards.
    let good = output(&server, json!({ "cell": cell, "grep": "hel+o" })).await;
    assert_eq!(u64_field(&good, "matches"), 1);
}

#[tokio::test]
async fn a_ten_megabyte_line_returns_and_the_server_stays_responsive() {
    let mut server = StdioServer::start(&[]).await;
    let out = server.exec("print('x' * 10_000_000)").await;
    out.assert_ok();
    assert_eq!(u64_field(&out, "output_bytes"), 10_000_001);
    assert!(u64_field(&out, "omitted_bytes") > 0);
    assert!(
        out.text.len() < 100_000,
        "the result text is {} bytes",
        out.text.len()
    );
    assert!(out.text.starts_with("xxxxxxxxxx"), "{}", &out.text[..100]);

    let w = output(
        &server,
        json!({ "cell": out.cell(), "offset": 9_999_990, "limit": 100 }),
    )
    .await;
    assert_eq!(w.str_field("text"), "xxxxxxxxxx\n");
    assert_eq!(u64_field(&w, "total_chars"), 10_000_001);

    let next = server.exec("6 * 7").await;
    next.assert_ok();
    assert_eq!(next.value(), Some("42"));
    server.assert_alive();
    server.assert_clean_stdout();
}

#[tokio::test]
async fn an_error_of_fifty_megabytes_ends_its_cell_capped() {
    let mut server = StdioServer::start(&[]).await;
    let out = server
        .call(
            "python_exec",
            json!({"code": "class Huge(Exception):\n    pass\nraise Huge('E' * 50_000_000)", "wait_s": 50}),
        )
        .await;
    assert_eq!(out.status(), "error", "{}", out.text);
    out.assert_raised("Huge");
    let size = serde_json::to_string(&out.raw).map_or(0, |s| s.len());
    assert!(size < 1 << 20, "an error's result is {size} bytes");
    let next = server.exec("6 * 7").await;
    assert_eq!(next.value(), Some("42"));
    server.assert_alive();
}

#[tokio::test]
async fn a_flood_keeps_server_memory_bounded_and_can_be_interrupted() {
    const RSS_LIMIT_KIB: u64 = 200 * 1024;
    let mut server = StdioServer::start(&[]).await;
    let pid = server.child.id().expect("the server's pid");
    let before = rss_kib(pid);

    let started = server
        .call(
            "python_exec",
            exec_wait_args("while True: print('x' * 1000)", 1.0),
        )
        .await;
    assert_eq!(started.status(), "running", "{started:#?}");
    let cell = started.cell();
    assert!(
        started.text.len() < 100_000,
        "a running result is {} bytes",
        started.text.len()
    );

    // Let it flood a while longer, then look at the server's memory.
    let waited = server.call("python_wait", json!({ "wait_s": 1.0 })).await;
    assert_eq!(waited.status(), "running", "{waited:#?}");
    let during = rss_kib(pid);
    assert!(
        during < RSS_LIMIT_KIB,
        "server RSS while flooding: {during} KiB (at start {before} KiB)"
    );

    let stopped = server
        .call("python_wait", json!({ "interrupt": true }))
        .await;
    assert_eq!(stopped.status(), "interrupted", "{stopped:#?}");
    assert_eq!(stopped.cell(), cell);
    assert!(
        stopped.text.contains("KeyboardInterrupt"),
        "{}",
        &stopped.text[stopped.text.len().saturating_sub(2000)..]
    );
    let after = rss_kib(pid);
    eprintln!("server RSS: {before} KiB at start, {during} KiB flooding, {after} KiB after");
    assert!(
        after < RSS_LIMIT_KIB,
        "server RSS after the flood: {after} KiB (at start {before} KiB, during {during} KiB)"
    );

    // The full output is still there to read, and the session works.
    let w = output(&server, json!({ "cell": cell, "lines": true, "limit": 1 })).await;
    assert_eq!(w.str_field("text"), format!("{}\n", "x".repeat(1000)));
    let next = server.exec("'still here'").await;
    next.assert_ok();
    assert_eq!(next.value(), Some("'still here'"));
    server.assert_alive();
    server.assert_clean_stdout();
}

#[tokio::test]
async fn carriage_returns_collapse_and_escape_codes_are_removed() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec(
            r"import sys
for i in range(5): sys.stdout.write(f'\r{i*25}%'); sys.stdout.flush()
print()
print('\x1b[31mred\x1b[0m')",
        )
        .await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(stdout.contains("100%"), "{stdout:?}");
    assert!(
        !stdout.contains("25%"),
        "progress states left in {stdout:?}"
    );
    assert!(!stdout.contains('\r'), "carriage return left in {stdout:?}");
    assert!(stdout.contains("red"), "{stdout:?}");
    assert!(!stdout.contains('\u{1b}'), "escape byte left in {stdout:?}");
    assert!(
        !stdout.contains("[31m"),
        "escape sequence left in {stdout:?}"
    );
    assert_eq!(stdout, "100%\nred\n");
    assert!(!out.text.contains('\u{1b}') && !out.text.contains("25%"));
    assert!(out.text.contains("100%\nred\n"), "{}", out.text);
}

#[tokio::test]
async fn invalid_utf8_shows_replacement_characters() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec(r"import os; os.write(1, b'ok \xff\xfe end\n')")
        .await;
    out.assert_ok();
    assert!(
        out.str_field("stdout").contains("ok \u{fffd}\u{fffd} end"),
        "{out:#?}"
    );
    assert!(out.text.contains("ok \u{fffd}\u{fffd} end"), "{}", out.text);
    let w = output(&server, json!({ "cell": out.cell() })).await;
    assert_eq!(w.str_field("text"), "ok \u{fffd}\u{fffd} end\n");
}

/// The 300+ KB output used by the spill tests: numbered lines with
/// multi-byte characters, so character offsets and bytes differ.
const SPILL_CODE: &str = "for i in range(20000): print(f'{i:06d} ' + 'αβγ'[i % 3] * 5)";

fn spill_expected() -> String {
    let letters = ['α', 'β', 'γ'];
    (0..20_000)
        .map(|i| {
            let c = letters[i % 3].to_string().repeat(5);
            format!("{i:06} {c}\n")
        })
        .collect()
}

#[tokio::test]
async fn the_full_output_reassembles_byte_for_byte_after_truncation() {
    let server = StdioServer::start(&[]).await;
    let expected = spill_expected();
    assert!(expected.len() > 300 * 1024, "{} bytes", expected.len());

    let out = server.exec(SPILL_CODE).await;
    out.assert_ok();
    assert_eq!(u64_field(&out, "output_bytes"), expected.len() as u64);
    assert!(
        u64_field(&out, "omitted_bytes") > 0,
        "{:#?}",
        out.structured
    );
    assert!(out.text.len() < 40_000);

    // A later cell must not disturb the earlier one's output.
    server.exec("print('another cell')").await.assert_ok();

    let (text, windows) = read_all_windows(&server, out.cell(), 65_536).await;
    assert!(windows >= 4, "only {windows} windows");
    assert_eq!(text.len(), expected.len(), "reassembled length");
    assert!(text == expected, "the reassembled output differs");

    let whole = output(&server, json!({ "cell": out.cell(), "limit": 1 })).await;
    assert_eq!(
        u64_field(&whole, "total_chars"),
        expected.chars().count() as u64
    );
    assert_eq!(u64_field(&whole, "total_lines"), 20_000);
    assert_eq!(u64_field(&whole, "dropped_bytes"), 0);
}

#[tokio::test]
async fn large_output_over_http_is_truncated_and_readable() {
    let server = HttpServer::start(&[], &[]).await;
    let client = server.connect(None).await;
    let peer = client.peer();
    let out = call(peer, "python_exec", json!({ "code": SPILL_CODE })).await;
    out.assert_ok();
    let expected = spill_expected();
    assert_eq!(u64_field(&out, "output_bytes"), expected.len() as u64);
    assert!(u64_field(&out, "omitted_bytes") > 0);
    assert!(out.text.contains("python_output"), "no marker");

    let mut text = String::new();
    let mut offset = 0u64;
    loop {
        let w = call(
            peer,
            "python_output",
            json!({ "cell": out.cell(), "offset": offset, "limit": 200_000 }),
        )
        .await;
        assert!(!w.is_error, "{w:#?}");
        text.push_str(w.str_field("text"));
        match w.structured["next_offset"].as_u64() {
            Some(next) => offset = next,
            None => break,
        }
    }
    assert!(text == expected, "the output read over HTTP differs");

    let grep = call(
        peer,
        "python_output",
        json!({ "cell": out.cell(), "grep": "^012345 ", "context": 0 }),
    )
    .await;
    assert_eq!(grep.str_field("text"), "12346: 012345 ααααα\n");
    let _ = client.cancel().await;
}
