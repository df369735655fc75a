//! The arguments of ferrepl's subcommands (`install`, `uninstall`,
//! `doctor`), parsed with the server's flags; `setup` carries them out.

use std::path::PathBuf;

/// Arguments of `ferrepl install`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    /// claude-code, claude-desktop, codex, cursor, vscode, gemini, or all (comma separated or repeated).
    #[arg(long = "client", value_name = "CLIENT", required = true)]
    pub clients: Vec<String>,
    /// user: the client's own configuration; project: the files clients read in --workdir
    /// (.mcp.json, .cursor/mcp.json, .vscode/mcp.json, .gemini/settings.json, .codex/config.toml).
    #[arg(long, default_value = "user", value_parser = ["user", "project"])]
    pub scope: String,
    /// The workspace ferrepl serves (written as its --workdir); with --scope project, where the
    /// project's files are (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Print what would change and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Arguments for the server, after `--` (e.g. -- --languages python,r).
    #[arg(last = true, value_name = "SERVER ARGS")]
    pub server_args: Vec<String>,
}

/// Arguments of `ferrepl uninstall`: which entries to remove, nothing about
/// the server they start.
#[derive(Debug, Clone, clap::Args)]
pub struct UninstallArgs {
    /// claude-code, claude-desktop, codex, cursor, vscode, gemini, or all (comma separated or repeated).
    #[arg(long = "client", value_name = "CLIENT", required = true)]
    pub clients: Vec<String>,
    /// user: the client's own configuration; project: the files clients read in --workdir
    /// (.mcp.json, .cursor/mcp.json, .vscode/mcp.json, .gemini/settings.json, .codex/config.toml).
    #[arg(long, default_value = "user", value_parser = ["user", "project"])]
    pub scope: String,
    /// With --scope project, where the project's files are (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Print what would change and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `ferrepl doctor`'s flags. The server's other settings come from the
/// server flags given before `doctor` (`ferrepl --python X doctor`) and its
/// FERREPL_* variables, as they would when it starts; these win over them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DoctorOptions {
    /// Print one JSON object (items with name, status, detail) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The Python to check (default: as the server picks it: FERREPL_PYTHON, the nearest .venv
    /// upward from the workspace, python3 on PATH).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// The R to check (default: FERREPL_R, $R_HOME/bin/R, R on PATH).
    #[arg(long = "r", value_name = "PATH")]
    pub r: Option<PathBuf>,
    /// The workspace sessions would use (default: FERREPL_WORKDIR, else the current directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
}

/// The server `doctor` checks: its settings and tokens (a refused token
/// file is one of doctor's items), or why its settings are refused.
pub type DoctorInputs = Result<
    (
        super::settings::Settings,
        anyhow::Result<super::tokens::TokenTable>,
    ),
    String,
>;

/// What `doctor` checks: the server's settings (its flags and FERREPL_*
/// variables) with doctor's own `--workdir`, `--python` and `--r` over
/// them, and its tokens; or why the server would refuse its settings.
pub fn doctor_inputs(server: &super::Flags, opts: &DoctorOptions) -> DoctorInputs {
    let mut flags = server.clone();
    flags.command = None;
    let overrides = [
        (&mut flags.workdir, &opts.workdir),
        (&mut flags.python, &opts.python),
        (&mut flags.r, &opts.r),
    ];
    for (setting, given) in overrides {
        if given.is_some() {
            setting.clone_from(given);
        }
    }
    let settings = super::settings::Settings::from_flags(&flags).map_err(|e| format!("{e:#}"))?;
    Ok((settings, super::tokens::TokenTable::from_flags(&flags)))
}

/// Arguments of `ferrepl attach`.
#[derive(Debug, Clone, clap::Args)]
pub struct AttachArgs {
    /// The kernel session to attach to (a session made with python_sessions create ... kernel).
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// The workspace of the server (or tenant) whose session it is (default: the server or
    /// tenant whose workspace holds the current directory; else the only one that has SESSION).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// The tenant (a name of --auth-token-file) whose session it is, when tenants of a server
    /// have sessions of the same name.
    #[arg(long, value_name = "NAME")]
    pub tenant: Option<String>,
    /// Print the session's connection file (for another Jupyter client) instead of starting a
    /// console.
    #[arg(long)]
    pub print: bool,
    /// The program started as `PROGRAM console --existing FILE` (default: jupyter on PATH).
    #[arg(long, value_name = "PROGRAM", default_value = "jupyter")]
    pub jupyter: PathBuf,
}
