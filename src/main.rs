use std::process::ExitCode;

fn main() -> ExitCode {
    skillfs::cli::main()
}
