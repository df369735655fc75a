//! A server started by hand in a terminal says what it is: over stdio it
//! only waits for an MCP client, which is not what a person expects to see.
//! Printed to stderr (stdout carries MCP messages only), never when stdin is
//! a pipe, as it is when a client starts the server.

use std::io::IsTerminal;

use crate::setup::clients::Client;

/// Whether a person, not a client, is at the other end of stdin.
pub fn stdin_is_terminal() -> bool {
    std::io::stdin().is_terminal()
}

/// A few lines for that person: what this is, how to connect a client, and
/// how to leave; with `--viewer`, where the live view is.
pub fn hint(viewer: Option<&str>) -> String {
    const INDENT: &str = "                                    ";
    let mut names: Vec<String> = Client::ALL
        .iter()
        .map(|c| format!("{},", c.name()))
        .collect();
    names.push("or all".into());
    // The client names, wrapped under the column they start in.
    let mut clients = String::from("add it to CLIENT:");
    let mut width = INDENT.len() + clients.len();
    for name in names {
        if width + 1 + name.len() > 80 {
            clients.push('\n');
            clients.push_str(INDENT);
            width = INDENT.len();
        } else {
            clients.push(' ');
            width += 1;
        }
        width += name.len();
        clients.push_str(&name);
    }
    let viewer = viewer
        .map(|url| format!("Live view of the sessions in a browser: {url}\n"))
        .unwrap_or_default();
    format!(
        "\
ferrepl is an MCP server: it now waits for an MCP client on stdin. Agents start it
themselves once it is in their configuration:
  ferrepl install --client CLIENT   {clients}
  ferrepl doctor                    check this machine first
  ferrepl --help                    every option (--http ADDR serves HTTP instead)
{viewer}Ctrl-D or Ctrl-C exits.
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_names_every_client_and_the_way_out() {
        let hint = hint(None);
        for client in Client::ALL {
            assert!(hint.contains(client.name()), "{hint}");
        }
        for needle in [
            "MCP server",
            "ferrepl install --client",
            "ferrepl doctor",
            "--help",
            "Ctrl-D",
        ] {
            assert!(hint.contains(needle), "{needle}: {hint}");
        }
        assert!(hint.lines().count() <= 8, "{hint}");
        assert!(hint.lines().all(|l| l.len() <= 90), "{hint}");
        let with_viewer = super::hint(Some("http://127.0.0.1:8765/"));
        assert!(
            with_viewer.contains("Live view of the sessions in a browser: http://127.0.0.1:8765/")
        );
    }
}
