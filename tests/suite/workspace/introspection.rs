//! Completion from the live namespace, inspect with a cell function's source,
//! and help as plain text without a pager.

use crate::support::{StdioServer, ToolOutput, assert_success};
use serde_json::json;

fn completion_texts(out: &ToolOutput) -> Vec<String> {
    out.structured["completions"]
        .as_array()
        .unwrap_or_else(|| panic!("no completions array: {out:#?}"))
        .iter()
        .map(|c| {
            assert!(c["kind"].is_string(), "a completion has a kind: {c}");
            c["text"]
                .as_str()
                .unwrap_or_else(|| panic!("a completion has a text: {c}"))
                .to_string()
        })
        .collect()
}

/// Whether `texts` offers `name` (as the bare name, or as a dotted path to it).
fn offers(texts: &[String], name: &str) -> bool {
    texts
        .iter()
        .any(|t| t == name || t.ends_with(&format!(".{name}")))
}

#[tokio::test]
async fn complete_uses_the_live_namespace() {
    let server = StdioServer::start(&[]).await;
    server
        .exec(
            "import collections\n\
             class K:\n\
             \x20   def meth(self):\n\
             \x20       return 1\n\
             k = K()",
        )
        .await
        .assert_ok();

    let out = server
        .call("python_complete", json!({"code": "k.me"}))
        .await;
    assert_success(&out, "out");
    assert_eq!(out.structured["session"], "default", "{out:#?}");
    let engine = out.str_field("engine");
    assert!(
        engine == "jedi" || engine == "rlcompleter",
        "engine: {engine:?}"
    );
    assert!(out.str_field("token").ends_with("me"), "{out:#?}");
    let texts = completion_texts(&out);
    assert!(offers(&texts, "meth"), "{texts:?}");
    assert!(out.text.contains("meth"), "{:?}", out.text);

    let module = server
        .call("python_complete", json!({"code": "collections.Ord"}))
        .await;
    assert_success(&module, "module");
    let texts = completion_texts(&module);
    assert!(offers(&texts, "OrderedDict"), "{texts:?}");

    // A session where k does not exist has no such completion.
    server.exec_in("other", "pass").await.assert_ok();
    let elsewhere = server
        .call(
            "python_complete",
            json!({"code": "k.me", "session": "other"}),
        )
        .await;
    assert_success(&elsewhere, "elsewhere");
    assert_eq!(elsewhere.structured["session"], "other");
    assert!(
        !offers(&completion_texts(&elsewhere), "meth"),
        "{elsewhere:#?}"
    );
}

#[tokio::test]
async fn inspect_shows_signature_doc_and_source_of_a_cell_function() {
    let server = StdioServer::start(&[]).await;
    server.exec("y = 1").await.assert_ok();
    let defined = server
        .exec(
            "unit = 'm'\n\
             def area(r, pi=3.14):\n\
             \x20   \"\"\"Area of a circle of radius r.\"\"\"\n\
             \x20   return pi * r * r\n",
        )
        .await;
    defined.assert_ok();
    let cell = defined.cell();

    let out = server.call("python_inspect", json!({"name": "area"})).await;
    assert_success(&out, "out");
    let detail = &out.structured["detail"];
    assert_eq!(detail["signature"], "(r, pi=3.14)", "{detail}");
    assert_eq!(detail["doc"], "Area of a circle of radius r.", "{detail}");
    let file = format!("<cell {cell}>");
    assert_eq!(detail["file"], file.as_str(), "{detail}");
    assert_eq!(detail["line"].as_u64(), Some(2), "{detail}");
    let source = detail["source"]
        .as_str()
        .unwrap_or_else(|| panic!("no source: {detail}"));
    assert!(source.starts_with("def area(r, pi=3.14):"), "{source:?}");
    assert!(source.contains("return pi * r * r"), "{source:?}");
    assert!(out.text.contains("defined in"), "{:?}", out.text);
    assert!(out.text.contains(&file), "{:?}", out.text);
    assert!(out.text.contains("def area"), "{:?}", out.text);
}

#[tokio::test]
async fn help_prints_plain_text_without_a_pager() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec("help(len)").await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(
        stdout.contains("Help on built-in function len"),
        "{stdout:?}"
    );
    // The session is not stuck in a pager afterwards.
    let next = server.exec("'after help'").await;
    next.assert_ok();
    assert_eq!(next.value(), Some("'after help'"));
}
