//! r_install: bad arguments refused at once, a local source package loadable
//! as soon as it is installed.

use std::path::Path;

use super::{R_LANGS, SLOW_WAIT_S, assert_r_ok, assert_text_has, r_exec, r_server, session_pid};
use crate::support::{StdioServer, ToolOutput, assert_refused};
use serde_json::json;

#[tokio::test]
async fn r_install_refuses_bad_arguments_at_once() {
    let server = r_server().await;
    for bad in [
        "--configure-args=x",
        "pkg; system('id')",
        "https://x/y.tar.gz",
    ] {
        let out = server.call("r_install", json!({ "packages": [bad] })).await;
        assert_refused(&out, &[bad, "not an R package"]);
    }
    let out = server.call("r_install", json!({ "packages": [] })).await;
    assert_refused(&out, &["empty"]);
    assert!(
        !server.workdir.path().join(".ferrepl/r-library").exists()
            || std::fs::read_dir(server.workdir.path().join(".ferrepl/r-library"))
                .expect("read the library")
                .next()
                .is_none(),
        "nothing was installed"
    );
}

/// Writes the source of package `ferrepltestpkg` into `workdir` and builds
/// it with `R CMD build` there; returns the tarball's name.
pub(crate) async fn build_test_package(workdir: &Path) -> &'static str {
    let pkg = workdir.join("ferrepltestpkg");
    std::fs::create_dir_all(pkg.join("R")).expect("mkdir the package");
    let description = "Package: ferrepltestpkg\nVersion: 0.1\nTitle: A Test Package\n\
Description: A package the ferrepl tests install.\nLicense: MIT\n\
Author: Ferrepl Tests\nMaintainer: Ferrepl Tests <tests@example.com>\n";
    std::fs::write(pkg.join("DESCRIPTION"), description).expect("DESCRIPTION");
    std::fs::write(pkg.join("NAMESPACE"), "export(hello)\n").expect("NAMESPACE");
    std::fs::write(pkg.join("R/hello.R"), "hello <- function() 'hi from pkg'\n").expect("hello.R");
    let built = tokio::process::Command::new("R")
        .args(["CMD", "build", "--no-manual", "ferrepltestpkg"])
        .current_dir(workdir)
        .output()
        .await
        .expect("run R CMD build");
    let tarball = "ferrepltestpkg_0.1.tar.gz";
    assert!(
        built.status.success() && workdir.join(tarball).is_file(),
        "R CMD build failed ({}):\n{}\n{}",
        built.status,
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    tarball
}

/// r_install `packages`, called again while it answers "running"; returns
/// the finished job's result, which must be a clean exit.
async fn install_until_done(server: &StdioServer, packages: &[&str]) -> ToolOutput {
    let args = json!({ "packages": packages, "wait_s": SLOW_WAIT_S });
    let mut out = server.call("r_install", args.clone()).await;
    let mut rounds = 0;
    while out.structured["status"] == "running" {
        rounds += 1;
        assert!(rounds <= 10, "the install never finished: {out:#?}");
        out = server.call("r_install", args.clone()).await;
    }
    assert_eq!(out.structured["status"], "exited", "{out:#?}");
    assert_eq!(
        out.structured["exit_code"], 0,
        "the install failed: {out:#?}"
    );
    assert!(!out.is_error, "{out:#?}");
    out
}

#[tokio::test]
async fn r_install_of_a_local_source_package_is_loadable_at_once() {
    // A local source package builds: the operator has to allow it.
    let mut args = R_LANGS.to_vec();
    args.push("--allow-source-builds");
    let server = StdioServer::start(&args).await;
    let tarball = build_test_package(server.workdir.path()).await;
    assert_r_ok(&r_exec(&server, "before_install <- 7").await);
    let pid = session_pid(&server, "r").await;

    let done = install_until_done(&server, &[tarball]).await;
    assert!(done.text.contains(".ferrepl/r-library"), "{done:#?}");
    let installed = server
        .workdir
        .path()
        .join(".ferrepl/r-library/ferrepltestpkg/DESCRIPTION");
    assert!(installed.is_file(), "{} is missing", installed.display());

    let out = r_exec(&server, "library(ferrepltestpkg); hello()").await;
    assert_r_ok(&out);
    assert_text_has(&out, &["[1] \"hi from pkg\""]);
    let kept = r_exec(&server, "before_install").await;
    assert_text_has(&kept, &["[1] 7"]);
    assert_eq!(
        session_pid(&server, "r").await,
        pid,
        "the session was not restarted"
    );
}
