//! python_export: the file stays inside the workspace whatever the path
//! says, bad formats and cells are refused, a read-only workspace is not
//! written, and an R session exports with its plots as images.

use serde_json::{Value, json};

use crate::support::StdioServer;

async fn export(server: &StdioServer, args: Value) -> crate::support::ToolOutput {
    server.call("python_export", args).await
}

#[tokio::test]
async fn export_paths_formats_and_cells_are_checked() {
    let server = StdioServer::start(&[]).await;
    server.exec("x = 1").await.assert_ok();
    let outside = tempfile::tempdir().expect("outside dir");
    let link = server.workdir.path().join("link");
    std::os::unix::fs::symlink(outside.path(), &link).expect("symlink");
    let escapes = [
        "../escaped.ipynb".to_string(),
        format!("{}/escaped.ipynb", outside.path().display()),
        "link/escaped.ipynb".to_string(),
    ];
    for path in &escapes {
        let out = export(&server, json!({"path": path, "format": "ipynb"})).await;
        assert!(out.is_error, "{path}: {out:#?}");
    }
    assert!(
        std::fs::read_dir(outside.path())
            .map(|d| d.count())
            .unwrap_or(0)
            == 0,
        "a file was written outside the workspace"
    );
    assert!(
        !server
            .workdir
            .path()
            .parent()
            .map(|p| p.join("escaped.ipynb").exists())
            .unwrap_or(false)
    );
    for bad in [json!("html"), json!(1), json!(null)] {
        let raw = server
            .try_call("python_export", json!({"path": "a.ipynb", "format": bad}))
            .await;
        let refused = match &raw {
            Err(_) => true,
            Ok(r) => r.is_error == Some(true),
        };
        assert!(refused, "format {bad} was accepted: {raw:#?}");
    }
    let missing = export(&server, json!({"path": "a.py", "format": "py", "cell": 99})).await;
    assert!(
        missing.is_error && missing.text.contains("not a finished cell"),
        "{missing:#?}"
    );
    let unknown = export(
        &server,
        json!({"path": "a.py", "format": "py", "session": "nope"}),
    )
    .await;
    assert!(unknown.is_error, "{unknown:#?}");
    let ok = export(&server, json!({"path": "fine.py", "format": "py"})).await;
    assert!(!ok.is_error, "{ok:#?}");
    let text = std::fs::read_to_string(server.workdir.path().join("fine.py")).expect("fine.py");
    assert!(text.contains("# %% cell 1\nx = 1\n"), "{text}");
}

#[tokio::test]
async fn a_read_only_workspace_is_not_written() {
    let server = StdioServer::start(&["--sandbox", "read-only"]).await;
    server.exec("x = 1").await.assert_ok();
    let out = export(&server, json!({"path": "x.py", "format": "py"})).await;
    assert!(out.is_error, "{out:#?}");
    assert!(!server.workdir.path().join("x.py").exists());
}

#[tokio::test]
async fn an_r_session_exports_with_its_plots() {
    let server = StdioServer::start(&["--languages", "python,r"]).await;
    for code in ["v <- c(3, 1, 2)", "plot(sort(v))", "print(sum(v))"] {
        server
            .call("r_exec", json!({"code": code, "wait_s": 30}))
            .await
            .assert_ok();
    }
    let out = export(
        &server,
        json!({"path": "r.ipynb", "format": "ipynb", "session": "r"}),
    )
    .await;
    assert!(!out.is_error, "{out:#?}");
    let nb: Value = serde_json::from_str(
        &std::fs::read_to_string(server.workdir.path().join("r.ipynb")).expect("r.ipynb"),
    )
    .expect("notebook JSON");
    assert_eq!(nb["nbformat"], 4);
    assert_eq!(nb["metadata"]["kernelspec"]["name"], "ir");
    let cells = nb["cells"].as_array().cloned().unwrap_or_default();
    assert_eq!(cells.len(), 3, "{nb:#?}");
    let plot = &cells[1]["outputs"];
    let png = plot
        .as_array()
        .and_then(|o| o.iter().find(|o| o["output_type"] == "display_data"))
        .and_then(|o| o["data"]["image/png"].as_str())
        .unwrap_or_default();
    assert!(png.starts_with("iVBORw0KGgo"), "no PNG in {plot:#?}");
    let printed: String = cells[2]["outputs"][0]["text"]
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(printed, "[1] 6\n", "{cells:#?}");
}

/// A cell whose first result came back while it ran (here at its input()
/// prompt) is exported whole: the output returned early and the rest.
#[tokio::test]
async fn a_cell_returned_while_running_is_exported_whole() {
    let server = StdioServer::start(&[]).await;
    let first = server
        .call(
            "python_exec",
            json!({"code": "print('early-part')\nname = input('go? ')\nprint('late-part', name)", "wait_s": 30}),
        )
        .await;
    assert!(
        first.text.contains("early-part") && first.text.contains("go? "),
        "{first:#?}"
    );
    let rest = server
        .call("python_wait", json!({"input": "now", "wait_s": 30}))
        .await;
    assert!(
        !rest.is_error && rest.text.contains("late-part now") && !rest.text.contains("early-part"),
        "{rest:#?}"
    );
    let out = export(&server, json!({"path": "whole.ipynb", "format": "ipynb"})).await;
    assert!(!out.is_error, "{out:#?}");
    let text = std::fs::read_to_string(server.workdir.path().join("whole.ipynb")).expect("ipynb");
    let notebook: Value = serde_json::from_str(&text).expect("json");
    let outputs = notebook["cells"][0]["outputs"].to_string();
    let early = outputs
        .find("early-part")
        .expect("the early output is kept");
    let late = outputs
        .find("late-part now")
        .expect("the later output is kept");
    assert!(early < late, "{outputs}");
}

/// An image's type is what its bytes are, not what the agent's code names:
/// an "image" declared as text/html (which notebook tools would render)
/// is not exported; a PNG is.
#[tokio::test]
async fn only_png_and_jpeg_bytes_are_exported_as_images() {
    let server = StdioServer::start(&[]).await;
    let code = "from ferrepl_driver.display import emit_image\n\
                emit_image('text/html', b'<script>window.pwned = 1</script>')\n\
                emit_image('image/png', b'<svg onload=\"alert(1)\"></svg>')\n\
                emit_image('image/png', b'\\x89PNG\\r\\n\\x1a\\n' + b'0' * 32)";
    server.exec(code).await.assert_ok();
    let out = export(&server, json!({"path": "typed.ipynb", "format": "ipynb"})).await;
    assert!(!out.is_error, "{out:#?}");
    let text = std::fs::read_to_string(server.workdir.path().join("typed.ipynb")).expect("ipynb");
    let notebook: Value = serde_json::from_str(&text).expect("json");
    let outputs = &notebook["cells"][0]["outputs"];
    let data: Vec<&Value> = outputs
        .as_array()
        .expect("outputs")
        .iter()
        .filter_map(|o| o.get("data"))
        .collect();
    assert_eq!(data.len(), 1, "only the PNG: {outputs}");
    assert!(data[0].get("image/png").is_some(), "{outputs}");
    let shown = outputs.to_string();
    assert!(
        !shown.contains("text/html") && !shown.contains("PHN2Zy"),
        "neither the HTML nor the SVG (base64 PHN2Zy) is written: {shown}"
    );
    assert!(shown.contains("not PNG or JPEG"), "{shown}");
}
