//! R's help pages, r_inspect and r_complete.

use super::{assert_r_ok, assert_text_has, r_exec, r_server};
use crate::support::ToolOutput;
use serde_json::json;

#[tokio::test]
async fn help_pages_are_plain_text_and_return_at_once() {
    let server = r_server().await;
    let out = r_exec(&server, "?mean").await;
    assert_r_ok(&out);
    assert_text_has(&out, &["Arithmetic Mean"]);
    assert!(
        !out.text.contains('\u{8}'),
        "the help text has backspaces (overstrike):\n{:?}",
        out.text
    );
    let out = r_exec(&server, "help('sum')").await;
    assert_r_ok(&out);
    assert_text_has(&out, &["Sum of Vector Elements"]);
}

#[tokio::test]
async fn inspect_lists_objects_and_details_one() {
    let server = r_server().await;
    let setup = "df <- data.frame(a = 1:3, b = letters[1:3]); v <- c(1.5, 2)";
    assert_r_ok(&r_exec(&server, setup).await);

    let all = server.call("r_inspect", json!({})).await;
    assert!(!all.is_error, "{all:#?}");
    let vars = all.structured["variables"]
        .as_array()
        .unwrap_or_else(|| panic!("no variables array: {all:#?}"));
    let find = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {all:#?}"))
    };
    let df = find("df");
    assert_eq!(df["type"], "data.frame", "{df}");
    assert_eq!(df["shape"], json!([3, 2]), "{df}");
    let v = find("v");
    assert_eq!(v["type"], "numeric", "{v}");
    assert_eq!(v["len"], 2, "{v}");
    assert_text_has(&all, &["df", "v"]);

    let one = server.call("r_inspect", json!({ "name": "df" })).await;
    assert!(!one.is_error, "{one:#?}");
    assert_text_has(&one, &["data.frame"]);
    let header = one
        .text
        .lines()
        .any(|l| l.split_whitespace().rev().take(2).eq(["b", "a"]));
    let columns = one.text.contains("$ a") && one.text.contains("$ b");
    assert!(header || columns, "the columns a and b:\n{}", one.text);

    let unknown = server.call("r_inspect", json!({ "name": "nope" })).await;
    assert!(unknown.is_error, "{unknown:#?}");
    assert_text_has(&unknown, &["nope", "not defined"]);
    assert!(
        !unknown.text.contains("python_"),
        "an R session's hint names R tools: {unknown:#?}"
    );
}

#[tokio::test]
async fn complete_offers_objects_of_attached_packages() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "my_variable_42 <- 1").await);
    let texts = |out: &ToolOutput| -> Vec<String> {
        assert!(!out.is_error, "r_complete failed: {out:#?}");
        out.structured["completions"]
            .as_array()
            .unwrap_or_else(|| panic!("no completions array: {out:#?}"))
            .iter()
            .filter_map(|c| c["text"].as_str().map(str::to_string))
            .collect()
    };
    let out = server.call("r_complete", json!({ "code": "mtca" })).await;
    let got = texts(&out);
    assert!(got.iter().any(|t| t == "mtcars"), "{got:?} in {out:#?}");

    let out = server
        .call("r_complete", json!({ "code": "x <- my_vari" }))
        .await;
    let got = texts(&out);
    assert!(
        got.iter().any(|t| t == "my_variable_42"),
        "{got:?} in {out:#?}"
    );
}
