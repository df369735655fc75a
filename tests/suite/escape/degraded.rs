//! Where the kernel refuses namespaces (Ubuntu's AppArmor rule, most
//! containers) the sandbox degrades to Landlock, seccomp and dropped
//! capabilities, and says so. `--no-namespaces` takes that path on purpose:
//! what the degraded sandbox still promises is checked here.

use serde_json::json;

use super::args::fake_home_with_aws;
use crate::support::{ATTEMPT, StdioServer, assert_failed, everything, py, py_path, unique};

#[tokio::test]
async fn without_namespaces_the_gap_is_named_and_secrets_stay_out_of_reach() {
    let secret = unique("degraded-secret-");
    let (home, aws) = fake_home_with_aws(&secret);
    let home_str = home.path().to_str().expect("utf-8 home").to_string();
    let server = StdioServer::start_with_env(
        &["--no-namespaces"],
        &[
            ("HOME", home_str.as_str()),
            ("DECOY_API_KEY", secret.as_str()),
        ],
    )
    .await;

    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(
        status.text.contains("NO private namespaces") && status.text.contains("--no-namespaces"),
        "the status names the missing protection: {}",
        status.text
    );

    // Session A leaves a file in its own temporary directory.
    let a = server
        .exec_in(
            "a",
            "import os\np = os.path.join(os.environ['TMPDIR'], 'a-note')\nopen(p, 'w').write('note')\np",
        )
        .await;
    a.assert_ok();
    let a_note = a
        .value()
        .expect("path")
        .trim_matches(['\'', '"'])
        .to_string();
    let server_pid = server.child.id().expect("server pid");

    let code = format!(
        "{ATTEMPT}
import os, socket
attempt('home', lambda: open({cred}).read())
attempt('other tmp', lambda: open({note}).read())
attempt('server environ', lambda: open('/proc/{server_pid}/environ', 'rb').read())
attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt('inet', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt('env', lambda: os.environ['DECOY_API_KEY'])
caps = [l for l in open('/proc/self/status') if l.startswith('Cap')]
print('caps:', all(l.split()[1] == '0000000000000000' for l in caps if not l.startswith('CapBnd')) )
",
        cred = py_path(&aws.join("credentials")),
        note = py(&a_note),
    );
    let b = server.exec_in("b", &code).await;
    b.assert_ok();
    assert_failed(&b, "home", "the home directory is hidden by Landlock");
    assert_failed(&b, "other tmp", "another session's temporary directory");
    assert_failed(&b, "server environ", "the server is not dumpable");
    assert_failed(&b, "packet", "seccomp allows Unix sockets only");
    assert_failed(&b, "inet", "the network is off");
    assert_failed(&b, "env", "the server's environment is not inherited");
    assert!(
        b.str_field("stdout").contains("caps: True"),
        "no capability in the effective, permitted, inheritable, ambient sets: {b:#?}"
    );
    assert!(
        !everything(&b).contains(&secret),
        "the secret leaked: {b:#?}"
    );
}
