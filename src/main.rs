//! ferrepl: persistent Python sessions for AI agents over MCP.

use std::process::ExitCode;

use ferrepl::config::{Command, Flags};
use ferrepl::sandbox;

fn main() -> ExitCode {
    // Launcher modes run before anything else (single-threaded, no runtime).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(sandbox::launcher::LAUNCH_ARG) {
        sandbox::launcher::run(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some(ferrepl::upstream::contain::CONTAIN_ARG) {
        ferrepl::upstream::contain::run(&args[2..]);
    }
    // Sessions run as the same user: keep them out of this process's memory
    // and /proc/<pid>/environ (the auth token, the operator's environment).
    // SAFETY: prctl(PR_SET_DUMPABLE) has no memory effects.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // The version with the git revision and the sandbox compiled in (made once).
    let version: &'static str = Box::leak(ferrepl::setup::doctor::long_version().into_boxed_str());
    let matches = <Flags as clap::CommandFactory>::command()
        .version(version)
        .get_matches();
    let flags = match <Flags as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match &flags.command {
        Some(Command::Install(args)) => return ferrepl::setup::run_install(args),
        Some(Command::Uninstall(args)) => return ferrepl::setup::run_uninstall(args),
        Some(Command::Doctor(opts)) => {
            let inputs = ferrepl::config::commands::doctor_inputs(&flags, opts);
            return ferrepl::setup::doctor::run(inputs, opts);
        }
        Some(Command::Attach(args)) => return ferrepl::setup::attach::run(args),
        None => {}
    }
    let token_on_command_line =
        matches.value_source("auth_token") == Some(clap::parser::ValueSource::CommandLine);
    let filter =
        tracing_subscriber::EnvFilter::try_new(ferrepl::config::log_directives(&flags.log_level))
            .unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(ferrepl::config::log_directives("info"))
            });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match flags.log_format {
        ferrepl::config::LogFormat::Text => logs.init(),
        ferrepl::config::LogFormat::Json => logs.json().init(),
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if flags.http.is_none() && std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        // One client, whose calls come one after another: a second worker
        // thread only adds handoffs (5.4 -> 3.1 context switches and ~20 %
        // less server CPU per call); blocking work has its own pool.
        runtime.worker_threads(1);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferrepl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if token_on_command_line {
        tracing::warn!(
            "--auth-token on the command line is visible to every local process (ps, /proc); use --auth-token-file FILE or FERREPL_AUTH_TOKEN"
        );
    }
    let code = match runtime.block_on(ferrepl::app::run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    };
    // A blocking read of stdin (when it is not a pipe) cannot be cancelled
    // and would hold the runtime's drop until the client writes or closes
    // it; everything that matters has been cleaned up by now.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    code
}
