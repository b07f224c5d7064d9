//! `headroom completions SHELL` and `headroom man`: shell completion scripts
//! and the man page, generated from the same command definition as `--help`,
//! so they never disagree with it.

use crate::Outcome;
use anyhow::{Context, Result};
use clap::{Args, CommandFactory};
use clap_complete::Shell;
use std::path::PathBuf;

/// Print a completion script for a shell.
#[derive(Args, Debug)]
#[command(after_help = "Install it where the shell looks (for zsh, a directory on fpath, added before compinit).\n\n\
                        Examples:\n  \
                        headroom completions bash > ~/.local/share/bash-completion/completions/headroom\n  \
                        headroom completions zsh > ~/.zfunc/_headroom\n  \
                        headroom completions fish > ~/.config/fish/completions/headroom.fish")]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// Print a man page (roff), or write every page to a directory.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
                        headroom man plan > headroom-plan.1\n  \
                        headroom man --out-dir ~/.local/share/man/man1")]
pub struct ManArgs {
    /// The command whose page to print (`plan`, `kv simulate`); none for headroom's own.
    command: Vec<String>,
    /// Write headroom.1 and a page per command (headroom-plan.1, headroom-kv-simulate.1, ...) here.
    #[arg(long, conflicts_with = "command")]
    out_dir: Option<PathBuf>,
}

pub fn completions(a: CompletionsArgs) -> Result<Outcome> {
    let mut cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "headroom", &mut out);
    Ok(Outcome::new(String::from_utf8(out).context("the completion script is not UTF-8")?, 0))
}

pub fn man(a: ManArgs) -> Result<Outcome> {
    let mut root = crate::Cli::command();
    root.build();
    if let Some(dir) = a.out_dir {
        let mut pages = Vec::new();
        render_pages(&root, "headroom", &mut pages)?;
        let written = crate::out_file::write_set_atomically(&dir, &pages)?;
        let mut out = String::new();
        for path in written {
            outln!(out, "{}", path.display());
        }
        return Ok(Outcome::new(out, 0));
    }
    let (mut cmd, mut name) = (&root, "headroom".to_string());
    for word in &a.command {
        cmd = cmd.find_subcommand(word).ok_or_else(|| {
            let known: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).filter(|n| *n != "help").collect();
            anyhow::anyhow!("{name} has no command `{word}`; it has: {}", known.join(", "))
        })?;
        name = format!("{name}-{word}");
    }
    Ok(Outcome::new(page(cmd, &name)?, 0))
}

/// One command's page, under the name its parent's page refers to it by.
fn page(cmd: &clap::Command, name: &str) -> Result<String> {
    let mut out = Vec::new();
    let cmd = cmd.clone().name(name.to_string()).version(env!("CARGO_PKG_VERSION"));
    clap_mangen::Man::new(cmd).render(&mut out).context("rendering the man page")?;
    String::from_utf8(out).context("the man page is not UTF-8")
}

/// Every page, as (file name, text): headroom.1 and one per command.
fn render_pages(cmd: &clap::Command, name: &str, pages: &mut Vec<(String, String)>) -> Result<()> {
    pages.push((format!("{name}.1"), page(cmd, name)?));
    for sub in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
        render_pages(sub, &format!("{name}-{}", sub.get_name()), pages)?;
    }
    Ok(())
}
