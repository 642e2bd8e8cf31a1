//! `bunkai flow cc [CLANG_ARGS...]`: clang-14 with the join-point pass
//! (cc.rs).

use crate::cc;
use anyhow::Result;
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CcArgs {
    /// Arguments for clang-14, as you would give them to clang
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CLANG_ARGS"
    )]
    pub args: Vec<OsString>,
}

pub const ABOUT: &str = "Compile and link with clang-14, recording join points and placing sleds (adds -g)";
pub const LONG_ABOUT: &str = "Compile and link with clang-14, recording join points and placing sleds (adds -g)

Every other argument goes to clang-14 as it is (--version included, so build systems that probe \
$CC --version see clang's). Pass options reach the pass with -mllvm: -bunkai-flow-structs=a,b \
-bunkai-flow-functions=f,g -bunkai-flow-files=x.c -bunkai-flow-kinds=load,store,addr,entry \
-bunkai-flow-locals=false -bunkai-flow-max-operands=N -bunkai-flow-verbose.

Examples:
  bunkai flow cc -O2 -o server server.c          # join points and sleds everywhere
  bunkai flow cc -O2 -mllvm -bunkai-flow-structs=request -o server server.c
  make CC='bunkai flow cc'                        # a whole project

clang's own options: clang-14 --help";

/// `--help` or `-h` alone is ours (clang's would be 1,175 lines of its
/// own options); everything else is clang's.
pub fn run(a: CcArgs) -> Result<ExitCode> {
    if a.args.len() == 1 && (a.args[0] == "--help" || a.args[0] == "-h") {
        let mut cmd = <CcArgs as clap::Args>::augment_args(
            clap::Command::new("cc").bin_name("bunkai flow cc").about(ABOUT).long_about(LONG_ABOUT),
        )
        .disable_help_flag(true)
        .disable_version_flag(true);
        let help = if a.args[0] == "-h" { cmd.render_help() } else { cmd.render_long_help() };
        use std::io::Write;
        write!(std::io::stdout(), "{help}")?;
        return Ok(ExitCode::SUCCESS);
    }
    cc::run(&a.args)
}
