//! The command line of `mountguard-controller` and of the kubectl plugin
//! `kubectl mountguard`: the commands and where each one's flags are
//! defined (`run`: [`RunArgs`], checked into
//! [`Settings`](crate::live::Settings); `status`, `wait`: the live
//! module's `status` and `wait`; `verify`: [`crate::offline`]).

use crate::live::RunArgs;
use crate::live::client::ProxyArgs;
use crate::live::status::{StatusArgs, StatusQuery};
use crate::live::wait::{WaitArgs, WaitOptions};
use crate::offline::VerifyArgs;

/// Command line of `mountguard-controller` (all subcommands).
#[derive(Debug, clap::Parser)]
#[command(
    name = "mountguard-controller",
    version,
    about = "mountguard controller"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Command line of `kubectl mountguard` (the same binary, installed or
/// linked as `kubectl-mountguard`): reaches the controller through the API
/// server's service proxy with the user's kubeconfig.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-mountguard",
    bin_name = "kubectl mountguard",
    version,
    about = "mountguard verdicts and rollout gate, through the Kubernetes API server"
)]
pub struct PluginCli {
    /// Cluster and controller Service.
    #[command(flatten)]
    pub proxy: ProxyArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// Subcommands of the kubectl plugin.
#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Print the controller's verdicts.
    Status(StatusQuery),
    /// Wait until every consumer of an object is verified fresh on its
    /// node for the object's current content (exit 0), or time out (1).
    Wait(WaitOptions),
}

/// Whether the program was started as the kubectl plugin (`argv[0]`'s
/// file name is `kubectl-mountguard`, as kubectl runs plugins found on
/// `PATH`).
pub fn invoked_as_plugin(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "kubectl-mountguard" || n == "kubectl-mountguard.exe")
}

/// Subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run the controller: watches, report API, verdicts, metrics, Events.
    Run(Box<RunArgs>),
    /// Print the verdicts of a running controller.
    Status(StatusArgs),
    /// Wait until every consumer of an object is verified fresh on its
    /// node for the object's current content (exit 0), or time out (1).
    Wait(WaitArgs),
    /// Evaluate verdicts offline from an object dump and agent inventories.
    Verify(VerifyArgs),
}
