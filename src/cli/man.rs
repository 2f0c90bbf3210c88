//! `skillfs man`: the man pages, made from the one clap definition of the
//! command line (`cli::Cli`), so that they never say other than `--help`.
//!
//! Locks: none.

use crate::error::{Exit, Failure};

/// `skillfs man`: the top page, one command's page, or every page written
/// into `dir`, all from the one clap definition, so that each page the top
/// page cites (`skillfs-restore(1)`) exists.
pub fn man(
    cli: clap::Command,
    command: Option<&str>,
    dir: Option<&std::path::Path>,
) -> Result<(), Failure> {
    // Without `help`: it is no command of its own, and has no page.
    let mut cmd = cli.disable_help_subcommand(true);
    cmd.build();
    // Every page names the package and its version (a command has none
    // of its own).
    let page = |c: clap::Command| {
        clap_mangen::Man::new(c).source(format!("skillfs {}", env!("CARGO_PKG_VERSION")))
    };
    if let Some(dir) = dir {
        let mut pages = Vec::new();
        let pages_of = std::iter::once(cmd.clone()).chain(cmd.get_subcommands().cloned());
        std::fs::create_dir_all(dir)
            .and_then(|()| {
                for c in pages_of.filter(|c| !c.is_hide_set()) {
                    let written = page(c).generate_to(dir)?;
                    pages.push(
                        written
                            .file_name()
                            .unwrap_or_default()
                            .display()
                            .to_string(),
                    );
                }
                Ok(())
            })
            .map_err(|e| Failure::io(Exit::Internal, "write the man pages into", dir, &e))?;
        println!(
            "wrote {} man pages to {}: {}",
            pages.len(),
            dir.display(),
            pages.join(" ")
        );
        return Ok(());
    }
    let chosen = match command {
        None => cmd,
        Some(name) => cmd.find_subcommand(name).cloned().ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                format!(
                    "'{name}' is not a skillfs command (`skillfs --help` lists them); \
                     `skillfs man` alone prints the page of skillfs"
                ),
            )
        })?,
    };
    page(chosen)
        .render(&mut std::io::stdout())
        .map_err(|e| Failure::new(Exit::Internal, format!("could not write the man page: {e}")))
}
