//! A tiny pure-Python wheel built locally (no network, no build backend),
//! for the install tests.

use std::path::{Path, PathBuf};

/// Builds `<dir>/<name>-<version>-py3-none-any.whl` whose module `name`
/// has `VALUE = <value>`; returns its path.
pub fn pure_wheel(dir: &Path, name: &str, version: &str, value: i64) -> PathBuf {
    wheel_with_files(dir, name, version, value, &[])
}

/// [`pure_wheel`] that also ships `files` (path in site-packages, text):
/// a `.pth` of its own, say.
pub fn wheel_with_files(
    dir: &Path,
    name: &str,
    version: &str,
    value: i64,
    files: &[(&str, &str)],
) -> PathBuf {
    let wheel = dir.join(format!("{name}-{version}-py3-none-any.whl"));
    let script = r#"
import sys, zipfile
path, name, version, value = sys.argv[1:5]
extra = sys.argv[5:]
info = f"{name}-{version}.dist-info"
with zipfile.ZipFile(path, "w") as z:
    z.writestr(f"{name}/__init__.py", f"VALUE = {value}\n")
    for at, text in zip(extra[::2], extra[1::2]):
        z.writestr(at, text)
    z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(f"{info}/RECORD", "")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .args([name, version, &value.to_string()])
        .args(files.iter().flat_map(|(at, text)| [*at, *text]))
        .output()
        .expect("run python3 to build a wheel");
    assert!(
        out.status.success() && wheel.is_file(),
        "building {} failed: {}",
        wheel.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    wheel
}
