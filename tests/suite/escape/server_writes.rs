//! Protected places (issue 40) against the writes the server makes for the
//! agent, outside the sandbox: file_write, file_delete and python_export
//! aimed at `.git`, a hook, `.mcp.json`, a nested `.git`, through links the
//! host made (`g -> .git`, a link to a parent, a link into `.git/hooks`),
//! and a recursive delete of a tree holding one. Each is refused with the
//! place and the flag named, and leaves every file byte for byte (and a
//! hook's mode) as it was; ordinary files and `.gitignore` are written, and
//! `--allow-write-protected .git` frees `.git` alone.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{StdioServer, ToolOutput, assert_tool_error};

const CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n";
const HOOK: &str = "#!/bin/sh\necho the user's own hook\n";

/// A git repository the host made in the workspace, with an executable
/// hook, a nested repository, a project `.mcp.json`, and links to
/// `.git`, to `.git/hooks` and to a parent.
struct Repo {
    root: PathBuf,
}

impl Repo {
    fn new(server: &StdioServer) -> Self {
        let root = server
            .workdir
            .path()
            .canonicalize()
            .expect("canonical workspace");
        std::fs::create_dir_all(root.join(".git/hooks")).expect("mkdir .git/hooks");
        std::fs::write(root.join(".git/config"), CONFIG).expect("write .git/config");
        let hook = root.join(".git/hooks/pre-commit");
        std::fs::write(&hook, HOOK).expect("write the hook");
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir_all(root.join("proj/deep/sub/.git")).expect("nested .git");
        std::fs::write(
            root.join("proj/deep/sub/.git/HEAD"),
            "ref: refs/heads/main\n",
        )
        .expect("nested HEAD");
        std::fs::write(root.join("proj/a.txt"), "a\n").expect("proj/a.txt");
        std::fs::write(root.join(".mcp.json"), "{\"mcpServers\": {}}\n").expect(".mcp.json");
        std::os::unix::fs::symlink(".git", root.join("g")).expect("g -> .git");
        std::os::unix::fs::symlink(".git/hooks", root.join("hooks")).expect("hooks");
        std::fs::create_dir(root.join("sub")).expect("mkdir sub");
        std::os::unix::fs::symlink("..", root.join("sub/up")).expect("sub/up -> ..");
        Repo { root }
    }

    /// Every file the host made, unchanged; the hook still executable;
    /// nothing new in `.git`.
    fn assert_intact(&self, what: &str) {
        let read = |rel: &str| std::fs::read_to_string(self.root.join(rel)).unwrap_or_default();
        assert_eq!(read(".git/config"), CONFIG, "{what}: .git/config changed");
        assert_eq!(
            read(".git/hooks/pre-commit"),
            HOOK,
            "{what}: the hook changed"
        );
        let mode = std::fs::metadata(self.root.join(".git/hooks/pre-commit"))
            .expect("the hook")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{what}: the hook's mode changed");
        assert_eq!(
            read("proj/deep/sub/.git/HEAD"),
            "ref: refs/heads/main\n",
            "{what}"
        );
        assert_eq!(
            read("proj/a.txt"),
            "a\n",
            "{what}: proj was deleted in part"
        );
        assert_eq!(read(".mcp.json"), "{\"mcpServers\": {}}\n", "{what}");
        assert_eq!(
            names(&self.root.join(".git")),
            ["config", "hooks"],
            "{what}: something was made in .git"
        );
        assert_eq!(
            names(&self.root.join(".git/hooks")),
            ["pre-commit"],
            "{what}"
        );
        assert!(!self.root.join("new").exists(), "{what}: new/ was made");
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Refused, naming the protected place (its path ends with `place`) and
/// the flag that frees it.
fn assert_protected(out: &ToolOutput, place: &str, what: &str) {
    assert_tool_error(out, what);
    assert!(
        out.text.contains(&format!("{place} is protected")),
        "{what}: the error should name {place}: {}",
        out.text
    );
    assert!(
        out.text.contains("--allow-write-protected"),
        "{what}: the error should name the flag: {}",
        out.text
    );
}

#[tokio::test]
async fn file_tools_never_write_or_delete_a_protected_place() {
    let server = StdioServer::start(&["--tools", "files"]).await;
    let repo = Repo::new(&server);
    let git = format!("{}/.git", repo.root.display());
    let writes = [
        (".git/config", git.clone()),
        (".git/hooks/pre-commit", git.clone()),
        (".git/hooks/post-checkout", git.clone()),
        (
            "proj/deep/sub/.git/HEAD",
            format!("{}/proj/deep/sub/.git", repo.root.display()),
        ),
        (
            "new/.git/config",
            format!("{}/new/.git", repo.root.display()),
        ),
        (".mcp.json", format!("{}/.mcp.json", repo.root.display())),
        // Through links the host made: to .git, into its hooks, to a parent.
        ("g/config", git.clone()),
        ("g/hooks/pre-commit", git.clone()),
        ("g/made/deeper/x", git.clone()),
        ("hooks/pre-commit", git.clone()),
        ("hooks/pre-push", git.clone()),
        // Refused as given, before it is resolved.
        (
            "sub/up/.git/config",
            format!("{}/sub/up/.git", repo.root.display()),
        ),
    ];
    for (path, place) in &writes {
        for append in [false, true] {
            let what = format!("file_write {path} append={append}");
            let out = server
                .call(
                    "file_write",
                    json!({"path": path, "text": "[core]\n\tfsmonitor = touch /tmp/pwned\n", "append": append}),
                )
                .await;
            assert_protected(&out, place, &what);
            repo.assert_intact(&what);
        }
    }
    let deletes = [
        (".git", true, git.clone()),
        (".git", false, git.clone()),
        (".git/hooks/pre-commit", false, git.clone()),
        ("g/config", false, git.clone()),
        ("hooks/pre-commit", false, git.clone()),
        (
            "sub/up/.git",
            true,
            format!("{}/sub/up/.git", repo.root.display()),
        ),
        (
            ".mcp.json",
            false,
            format!("{}/.mcp.json", repo.root.display()),
        ),
        // A tree holding a repository deep inside: nothing of it deleted.
        (
            "proj",
            true,
            format!("{}/proj/deep/sub/.git", repo.root.display()),
        ),
        (
            "proj/deep",
            true,
            format!("{}/proj/deep/sub/.git", repo.root.display()),
        ),
    ];
    for (path, recursive, place) in &deletes {
        let what = format!("file_delete {path} recursive={recursive}");
        let out = server
            .call("file_delete", json!({"path": path, "recursive": recursive}))
            .await;
        assert_protected(&out, place, &what);
        repo.assert_intact(&what);
    }
    let out = server
        .call("file_delete", json!({"path": "proj", "recursive": true}))
        .await;
    assert!(out.text.contains("nothing was deleted"), "{}", out.text);

    // Controls: ordinary files, look-alikes, the links themselves.
    for path in [
        ".gitignore",
        "notes/todo.txt",
        "git/config",
        ".github/workflows/ci.yml",
    ] {
        let out = server
            .call("file_write", json!({"path": path, "text": "ok\n"}))
            .await;
        assert!(!out.is_error, "file_write {path}: {out:#?}");
        assert_eq!(
            std::fs::read_to_string(repo.root.join(path)).expect("written"),
            "ok\n"
        );
    }
    let out = server.call("file_delete", json!({"path": "g"})).await;
    assert!(!out.is_error, "deleting the link g: {out:#?}");
    let out = server
        .call("file_delete", json!({"path": "notes", "recursive": true}))
        .await;
    assert!(!out.is_error, "deleting notes/: {out:#?}");
    repo.assert_intact("after the controls");
}

#[tokio::test]
async fn python_export_never_writes_a_protected_place_nor_an_executable() {
    let server = StdioServer::start(&[]).await;
    let repo = Repo::new(&server);
    server.exec("x = 1").await.assert_ok();
    let git = format!("{}/.git", repo.root.display());
    for (path, format) in [
        (".git/config", "py"),
        (".git/hooks/pre-commit", "py"),
        (".git/hooks/pre-commit", "ipynb"),
        ("g/hooks/pre-commit", "py"),
        ("hooks/pre-commit", "py"),
        ("hooks/post-merge", "py"),
    ] {
        let what = format!("python_export {path} {format}");
        let out = server
            .call("python_export", json!({"path": path, "format": format}))
            .await;
        assert_protected(&out, &git, &what);
        repo.assert_intact(&what);
    }
    // Written over an executable elsewhere: it does not stay one.
    let script = repo.root.join("run.py");
    std::fs::write(&script, "#!/bin/sh\n").expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = server
        .call("python_export", json!({"path": "run.py", "format": "py"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let text = std::fs::read_to_string(&script).expect("exported");
    assert!(text.contains("x = 1"), "{text}");
    let mode = std::fs::metadata(&script)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0, "the export kept an exec bit: {mode:o}");
}

#[tokio::test]
async fn allow_write_protected_frees_only_the_name_given() {
    let server = StdioServer::start(&["--tools", "files", "--allow-write-protected", ".git"]).await;
    let root = server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical workspace");
    std::fs::create_dir(root.join(".git")).expect("mkdir .git");
    let out = server
        .call("file_write", json!({"path": ".git/x", "text": "freed\n"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(
        std::fs::read_to_string(root.join(".git/x")).expect("written"),
        "freed\n"
    );
    let out = server
        .call("file_write", json!({"path": ".mcp.json", "text": "{}"}))
        .await;
    assert_protected(
        &out,
        &format!("{}/.mcp.json", root.display()),
        "file_write .mcp.json",
    );
    assert!(!root.join(".mcp.json").exists());
}
